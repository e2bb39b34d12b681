"""``python -m bayespca``: the ``bayespca`` command (see :mod:`bayespca.cli`)."""

from bayespca.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
