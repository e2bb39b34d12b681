"""Compiled samplers kept between processes: JAX's persistent compilation cache.

NUTS and SVI compile their programs once per configuration (model, number
of components, identification, prior kind, ...; never per data set). Within
a process the compiled programs are reused; between processes, JAX's
persistent compilation cache keeps them on disk, so a notebook kernel that
restarts, or a script run again, does not compile again.

bayespca turns the cache on the first time a sampler or optimiser is
needed, in ``$BAYESPCA_CACHE_DIR`` or else the user's cache directory
(``$XDG_CACHE_HOME/bayespca/jax``, ``~/.cache/bayespca/jax`` on Linux,
``~/Library/Caches/bayespca/jax`` on macOS, ``%LOCALAPPDATA%\\bayespca\\jax``
on Windows). It caches programs that took at least a tenth of a second to
compile (a few MB per configuration). Set ``BAYESPCA_CACHE_DIR=off`` to keep it off;
a cache directory you set yourself (``jax.config.jax_compilation_cache_dir``)
is left as it is. Deleting the directory is always safe.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

__all__ = ["CACHE_ENV", "cache_directory", "enable_compilation_cache"]

CACHE_ENV = "BAYESPCA_CACHE_DIR"
_OFF = ("", "0", "off", "false", "no", "none")
# Programs that compile faster than this are not kept: reading one back costs a few
# milliseconds, and the samplers' smaller programs (chain set-up, constraining the draws)
# compile in 0.1-0.2 s in every new process.
_MIN_COMPILE_SECONDS = 0.1


def cache_directory() -> Path | None:
    """Where compiled programs are kept, or None when ``$BAYESPCA_CACHE_DIR`` turns the cache off.

    Examples
    --------
    >>> import os
    >>> os.environ[CACHE_ENV] = "off"
    >>> cache_directory() is None
    True
    >>> del os.environ[CACHE_ENV]
    """
    value = os.environ.get(CACHE_ENV)
    if value is not None:
        return None if value.strip().lower() in _OFF else Path(value).expanduser()
    if sys.platform == "win32":
        base = Path(os.environ.get("LOCALAPPDATA", Path.home() / "AppData" / "Local"))
    elif sys.platform == "darwin":
        base = Path.home() / "Library" / "Caches"
    else:
        base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "bayespca" / "jax"


def enable_compilation_cache() -> Path | None:
    """Point JAX's persistent compilation cache at :func:`cache_directory` (once; idempotent).

    Returns the directory in use, or None when the cache stays off (turned
    off, or the directory cannot be created: caching is an optimisation,
    never a reason to fail a fit).
    """
    import jax
    from jax.experimental.compilation_cache import compilation_cache

    current = jax.config.jax_compilation_cache_dir
    if current:
        return Path(current)
    path = cache_directory()
    if path is None:
        return None
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    jax.config.update("jax_compilation_cache_dir", str(path))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", _MIN_COMPILE_SECONDS)
    # JAX decides whether to use the cache at the first compilation of the process, which
    # may have happened before bayespca needed a sampler: let it decide again.
    compilation_cache.reset_cache()
    return path
