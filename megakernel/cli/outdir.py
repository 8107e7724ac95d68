"""Output folders: written whole or not at all, and nothing deleted that we did not write.

``staged(out, owned)`` checks ``out``, then yields a new hidden sibling folder
(``.NAME.partial-XXXXXXXX``) to fill. When the block ends normally the sibling
is renamed to ``out``; when it raises, or SIGINT or SIGTERM arrives (see
``interrupts``), the sibling and any parent folders it created are removed and
``out`` is left as it was. A sibling left by a compile that was killed
(SIGKILL) is removed by the next compile to the same ``out`` (``partials``).

``out`` may be absent, an empty folder, or a previous output that ``owned``
accepts (it returns the names in it, all of which we wrote, or raises
``OutputError`` saying why not). A previous output is renamed aside, the new one
renamed in, and only then the old one removed name by name, so a failure at any
point leaves either the old output or the new one at ``out``. Refused with
``OutputError``, before anything is written: any other non-empty folder, a file,
a symbolic link, ``/``, the home folder, the working directory and every folder
that contains it, and names too long for the file system.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import shutil
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

from megakernel.cli import interrupts, partials
from megakernel.errors import MegakernelError

# The siblings' names add at most this many bytes to the output's name:
# "." + NAME + ".previous-" + 8 hex digits.
_SIBLING_EXTRA = 1 + len(".previous-") + 8
_HINT = "give -o a new or empty folder, e.g. -o out/tiny-dense"


class OutputError(MegakernelError):
    """An output folder cannot be written without losing something."""


def _refuse(out: str, why: str, hint: str = _HINT) -> OutputError:
    return OutputError(f"refusing to write the output there: {why}; nothing was written "
                       "or deleted", path=f"-o {out}", hint=hint)


def _name_max(path: Path) -> int:
    """The longest file name, in bytes, the file system under ``path`` allows."""
    for folder in (path, *path.parents):
        try:
            return os.pathconf(folder, "PC_NAME_MAX")
        except (OSError, ValueError):
            continue
    return 255


def check_target(out: str) -> Path:
    """``out`` as an absolute path, if compile may write there (see the module
    docstring); else ``OutputError`` naming the path and what to do."""
    target = Path(os.path.abspath(out))
    if target.parent == target:
        raise _refuse(out, "it is the root folder /")
    limit = _name_max(target.parent)
    for part in target.parts[1:]:
        if len(os.fsencode(part)) > limit:
            raise _refuse(out, f"the path component {part[:40]!r}... is {len(part)} "
                          f"characters long; this file system allows {limit} bytes",
                          "use a shorter folder name")
    if len(os.fsencode(target.name)) + _SIBLING_EXTRA > limit:
        raise _refuse(out, f"the folder name is {len(target.name)} characters long; compile "
                      f"writes through a sibling named .NAME.partial-XXXXXXXX, so the name "
                      f"may have at most {limit - _SIBLING_EXTRA} bytes",
                      "use a shorter folder name")
    try:
        real = target.resolve()
        cwd = Path.cwd().resolve()
    except (OSError, RuntimeError) as err:
        raise _refuse(out, f"the path cannot be resolved ({err})") from None
    if real == cwd:
        raise _refuse(out, f"it is the working directory {cwd}, and compile replaces the "
                      "whole output folder")
    if real in cwd.parents:
        raise _refuse(out, f"it contains the working directory {cwd}, and compile replaces "
                      "the whole output folder")
    home = None
    with contextlib.suppress(RuntimeError, KeyError, OSError):   # no HOME, no passwd entry
        home = Path.home().resolve()
    if real == home:
        raise _refuse(out, "it is your home folder, and compile replaces the whole "
                      "output folder")
    if target.is_symlink():
        raise _refuse(out, f"it is a symbolic link to {os.readlink(target)}",
                      "give the folder itself, or a new folder")
    if target.exists() and not target.is_dir():
        raise _refuse(out, "it is a file, not a folder", "give a folder path")
    for above in target.parents:
        if os.path.lexists(above):
            if not above.is_dir():
                raise _refuse(out, f"{above} is a file, not a folder, so nothing can be "
                              "created inside it", "give a folder path")
            break
    return target


def _sibling(target: Path, kind: str) -> Path:
    """A name next to ``target`` that nothing has yet."""
    while True:
        path = target.with_name(f".{target.name}.{kind}-{secrets.token_hex(4)}")
        if not os.path.lexists(path):
            return path


def _make_parents(folder: Path, created: list[Path]) -> None:
    """Create ``folder`` and its missing parents, appending each to ``created``."""
    missing = []
    for f in (folder, *folder.parents):
        if os.path.lexists(f):
            break
        missing.append(f)
    for f in reversed(missing):
        try:
            os.mkdir(f)
        except OSError as err:
            raise OutputError(f"cannot create the folder {f}: {err.strerror}",
                              path=f"-o {folder}",
                              hint="give -o a folder you can write to") from None
        created.append(f)


def _make_sibling(target: Path, out: str, locks: list[int]) -> Path:
    """A new, empty hidden folder next to ``target``, made and locked by us (its
    lock's descriptor appended to ``locks``; see ``partials``)."""
    while True:
        path = _sibling(target, "partial")
        try:
            os.mkdir(path)
            locks.append(partials.lock(path))
            return path
        except FileExistsError:
            continue   # someone took the name since we looked: never reuse theirs
        except OSError as err:
            # The user's path, not our hidden sibling's name, which they never gave.
            raise OutputError(f"cannot create the folder {target}: {err.strerror}",
                              path=f"-o {out}", hint="give -o a folder you can write to") from None


def _remove_empty(folders: list[Path]) -> None:
    for f in reversed(folders):
        with contextlib.suppress(OSError):
            os.rmdir(f)   # only if still empty: never removes anything else


@contextlib.contextmanager
def staged(out: str, owned: Callable[[Path], list[str]]) -> Iterator[Path]:
    """Yield an empty hidden sibling of ``out`` to fill; publish it as ``out`` when
    the block succeeds, remove it when it does not (see the module docstring)."""
    target = check_target(out)
    if target.is_dir():
        owned(target)          # refuse someone else's folder before any work is done
    created: list[Path] = []
    made: list[Path] = []
    locks: list[int] = []

    def cleanup():   # safe at any point, and twice: removes only what we made
        for tmp in made:
            shutil.rmtree(tmp, ignore_errors=True)
        _remove_empty(created)
        while locks:
            partials.release(locks.pop())

    # A signal while the folder is filled removes it and exits (interrupts.py).
    with interrupts.exit_on_signal(cleanup):
        try:
            # Held, so no interrupt lands between making a folder and noting it.
            with interrupts.held():
                _make_parents(target.parent, created)
                partials.sweep(target)   # what a killed compile left here
                made.append(_make_sibling(target, out, locks))
            yield made[0]
            interrupts.checkpoint()   # an interrupt the work swallowed: publish nothing
            with interrupts.held():
                _publish(made[0], target, out, owned)
                made.clear()
                cleanup()             # only the lock is left to release
        except BaseException:
            with interrupts.held():
                cleanup()
            raise


def _publish(tmp: Path, target: Path, out: str, owned: Callable[[Path], list[str]]) -> None:
    try:
        os.rename(tmp, target)   # atomic when target is absent or an empty folder
        return
    except OSError as err:
        if err.errno not in (errno.ENOTEMPTY, errno.EEXIST):
            raise OutputError(f"cannot rename {tmp.name} to {target}: {err.strerror}",
                              path=f"-o {out}", hint=_HINT) from None
    owned(target)              # it may have changed since we looked at the start
    old = _sibling(target, "previous")
    os.rename(target, old)
    try:
        names = owned(old)     # checked again now that nobody else is writing to it
        os.rename(tmp, target)
    except BaseException:
        os.rename(old, target)
        raise
    for name in names:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(old / name)
    try:
        os.rmdir(old)
    except OSError:
        print(f"warning: the previous output now at {old} holds files compile did not "
              "write, so it was left there", file=sys.stderr)
