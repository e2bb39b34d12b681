from bayespca.cli import main

raise SystemExit(main())
