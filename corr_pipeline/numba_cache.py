"""numba's cache of compiled kernels: the user's own, and in the image seeded with the kernels
compiled when the image was built.

numba loads a cached kernel by unpickling its index and data files: whoever may write the cache
directory runs code in every process that reads it. :func:`use_private_cache` (run when the
package is imported, before anything imports numba) keeps the cache the user's alone:

- ``$NUMBA_CACHE_DIR`` set to a directory of the user's that nobody else may write
  (:func:`corr_pipeline.privacy.untrusted_reason`) is used as it is: a cache the user chose, or
  the private copy a parent process made (children inherit the variable);
- ``$NUMBA_CACHE_DIR`` set to anything else (another user's directory, one group or others may
  write, a link) is not used: a warning names it, and the process gets a private one;
- ``$CORR_PIPELINE_NUMBA_CACHE`` names a read-only directory of kernels compiled in advance (the
  image's, ``deploy/Dockerfile``): unless ``$NUMBA_CACHE_DIR`` is already a private cache, it is
  copied into a new private directory (``mkdtemp``: 0700, a name nobody can guess or take first,
  in ``$TMPDIR``, a pod's ``emptyDir``), which becomes ``$NUMBA_CACHE_DIR`` for this process and
  those it starts, so a pod loads the kernels instead of compiling them;
- neither set: numba's own default (beside the package's sources, else the user's
  ``~/.cache/numba``), both the user's.

A private directory this process made is removed when it exits.
"""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import stat
import sys
import tempfile
from pathlib import Path

from corr_pipeline import privacy, settings

__all__ = ["ENV_NUMBA_CACHE_DIR", "copy_cache", "use_private_cache"]

ENV_NUMBA_CACHE_DIR = "NUMBA_CACHE_DIR"
PRIVATE_PREFIX = "corr_pipeline-numba-"


def _cache_problem(path: Path) -> str | None:
    """Why the cache directory ``path`` must not be used, or None (a directory, not a link, of
    this user that nobody else may write)."""
    try:
        st = os.lstat(path)
    except OSError as exc:
        return f"{path}: {exc.strerror}"
    if not stat.S_ISDIR(st.st_mode):
        return f"{path} is not a directory"
    problem = privacy.untrusted_reason(path, st)
    return None if problem is None else f"{path} {problem[0]}"


def copy_cache(seed: Path, target: Path) -> int:
    """Copy the cache directory ``seed`` into the empty directory ``target``: directories 0700,
    files 0600 (the seed's read-only modes are not kept: numba adds kernels it compiles to the
    copy); returns the number of files copied. Links in the seed are not followed."""
    copied = 0
    for directory, subdirs, files in os.walk(seed):
        into = target / Path(directory).relative_to(seed)
        for name in subdirs:
            if not (Path(directory) / name).is_symlink():
                os.mkdir(into / name, 0o700)
        for name in files:
            source = Path(directory) / name
            if source.is_symlink() or not source.is_file():
                continue
            shutil.copyfile(source, into / name)
            os.chmod(into / name, 0o600)
            copied += 1
    return copied


def _private_copy(seed: Path | None) -> Path:
    """A new private cache directory (removed at this process's exit), holding a copy of
    ``seed`` when given."""
    target = Path(tempfile.mkdtemp(prefix=PRIVATE_PREFIX))
    owner = os.getpid()

    def remove() -> None:
        if os.getpid() == owner:  # not in a forked child that exits
            shutil.rmtree(target, ignore_errors=True)

    atexit.register(remove)
    if seed is not None:
        try:
            copy_cache(seed, target)
        except OSError as exc:
            logging.getLogger(__name__).warning(
                "%s: the compiled kernels could not be copied (%s); numba compiles them",
                seed,
                exc,
            )
    return target


def use_private_cache() -> Path | None:
    """Set ``$NUMBA_CACHE_DIR`` as the module docstring says; returns the cache directory it
    names, None when numba's default applies. A problem is a warning, never an error: the
    kernels then compile as without a cache."""
    current = os.environ.get(ENV_NUMBA_CACHE_DIR, "").strip()
    raw_seed = os.environ.get(settings.ENV_NUMBA_CACHE, "").strip()
    seed = Path(raw_seed) if raw_seed else None
    if current:
        problem = _cache_problem(Path(current))
        if problem is None:
            return Path(current)
        if Path(current).exists() or os.path.lexists(current):
            logging.getLogger(__name__).warning(
                "%s=%s is not used: %s; numba's cache is a private directory instead",
                ENV_NUMBA_CACHE_DIR,
                current,
                problem,
            )
        elif seed is None:
            try:
                os.makedirs(current, 0o700)
            except OSError:
                pass
            if _cache_problem(Path(current)) is None:
                return Path(current)
    elif seed is None:
        return None
    try:
        target = _private_copy(seed)
    except OSError as exc:
        logging.getLogger(__name__).warning("no private numba cache (%s): kernels compile", exc)
        os.environ.pop(ENV_NUMBA_CACHE_DIR, None)
        return None
    os.environ[ENV_NUMBA_CACHE_DIR] = str(target)
    if "numba" in sys.modules:  # imported before the package: make it read the variable again
        from numba.core import config

        config.reload_config()
    return target
