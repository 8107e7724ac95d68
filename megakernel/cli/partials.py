"""Partial output folders: each compile locks its own, and the next compile into
the same parent removes those whose compile died (SIGKILL, power loss).

``outdir.staged`` fills a hidden sibling ``.NAME.partial-XXXXXXXX`` and removes
it on any error or SIGINT/SIGTERM, but nothing runs on SIGKILL. So the compile
holds an exclusive ``flock`` on the folder itself while it fills it: the kernel
drops the lock when the process ends, however it ends. ``sweep`` removes a
sibling of the same output only when it can take that lock (no live process
holds it) and the folder is older than ``GRACE_S`` (a compile that has just
made its folder and not yet locked it is left alone). Nothing else is touched:
only exact ``.NAME.partial-`` + 8 hex digit names, only real folders.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import sys
import time
from pathlib import Path

GRACE_S = 60.0


def lock(folder: Path) -> int:
    """An open descriptor of ``folder`` holding its exclusive lock; close it to
    release (the lock also goes when the process dies)."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise
    return fd


def _stale(path: Path, now: float) -> int | None:
    """A descriptor holding ``path``'s lock if it is a dead compile's folder."""
    try:
        st = os.lstat(path)
        if not os.path.isdir(path) or os.path.islink(path) or now - st.st_mtime < GRACE_S:
            return None
        return lock(path)
    except OSError:   # locked by a live compile, or gone already
        return None


def sweep(target: Path) -> list[Path]:
    """Remove the partial siblings of ``target`` left by compiles that died;
    returns them (a note for each goes to stderr)."""
    pattern = re.compile(rf"\.{re.escape(target.name)}\.partial-[0-9a-f]{{8}}")
    try:
        names = [n for n in os.listdir(target.parent) if pattern.fullmatch(n)]
    except OSError:
        return []
    removed, now = [], time.time()
    for name in names:
        path = target.parent / name
        fd = _stale(path, now)
        if fd is None:
            continue
        try:   # removed while we hold its lock: no compile can be using it
            shutil.rmtree(path, ignore_errors=True)
        finally:
            os.close(fd)
        if not os.path.lexists(path):
            removed.append(path)
            print(f"note: removed {path}, left by a compile that was killed before it "
                  "finished", file=sys.stderr)
    return removed


def release(fd: int | None) -> None:
    if fd is not None:
        with contextlib.suppress(OSError):
            os.close(fd)
