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

Within a process the compiled programs stay in memory, and on Linux each
one holds memory maps of its own: about 1000 for a NUTS configuration. The
kernel allows a process ``vm.max_map_count`` of them (65530 by default),
and XLA crashes the process (a segmentation fault) when a compilation
finds none left, which a notebook reached after about 60 fits of distinct
shapes. So before each fit that compiles,
:func:`release_compiled_programs` drops every compiled program of the
process (``jax.clear_caches()``, the user's own JAX functions included)
once half the limit is in use; the next fits read their programs back from
the persistent cache, or compile them again where it is off.
"""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path

__all__ = ["CACHE_ENV", "cache_directory", "enable_compilation_cache", "release_compiled_programs"]

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


@functools.cache
def _map_limit() -> int | None:
    """The kernel's limit of memory maps a process may hold (``vm.max_map_count``); None off Linux."""
    try:
        return int(Path("/proc/sys/vm/max_map_count").read_text())
    except (OSError, ValueError):
        return None


def _maps_in_use() -> int:
    """Memory maps the process holds (lines of ``/proc/self/maps``; 30 ms at 30000)."""
    with open("/proc/self/maps", "rb") as maps:
        return sum(block.count(b"\n") for block in iter(lambda: maps.read(1 << 16), b""))


def release_compiled_programs() -> bool:
    """Drop the process's compiled JAX programs if they hold half its limit of memory maps.

    XLA's CPU programs keep their machine code in memory maps of their own,
    about 1000 for one NUTS configuration, and a Linux process may hold
    ``vm.max_map_count`` maps (65530 by default); a compilation that finds
    none left crashes the process. Fitters call this before they compile:
    past half the limit it calls ``jax.clear_caches()``, after which every
    JAX function of the process (the user's too) compiles again when next
    called, or reads its program back from the persistent cache
    (:func:`enable_compilation_cache`). Elsewhere than on Linux it does
    nothing.

    Returns
    -------
    bool
        Whether the programs were dropped.

    Examples
    --------
    >>> release_compiled_programs()  # a fresh process holds a few hundred maps
    False
    """
    limit = _map_limit()
    if limit is None or _maps_in_use() < limit // 2:
        return False
    import jax

    jax.clear_caches()
    return True
