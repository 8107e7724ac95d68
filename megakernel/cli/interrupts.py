"""Interrupts: SIGINT and SIGTERM end a command cleanly, with one line.

By default SIGTERM kills the process where it stands, so a compile stopped that
way would leave its half-written temporary folder behind. ``raised()`` handles
both signals while a command runs, in one of two ways:

- Inside ``exit_on_signal(cleanup)`` (compile, while it fills its temporary
  folder) the handler raises nothing: it runs ``cleanup``, prints the line and
  exits at once. An exception raised at an arbitrary point can land where it
  does harm: during jax's import, inside a C++ extension's initialisation,
  nanobind aborts the process on it (seen, exit -6), which would leave the
  folder behind.
- Elsewhere it raises ``Interrupted`` (a ``KeyboardInterrupt``, so no
  ``except Exception`` swallows it), and every ``finally`` runs: a check's
  temporary kernel folder is removed on the way out.

Python swallows an exception raised where nothing can receive it (a garbage
collector callback, which jax installs; a ``__del__``) and prints "Exception
ignored in ...". Such an interrupt is kept, its message silenced, and
``checkpoint()`` raises it again at the next point that checks (each step of a
command, and before an output is published), so no signal is lost.

``held()`` defers both signals for a critical section (renaming an output into
place, removing a temporary folder) and delivers them when it ends.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

SIGNALS = (signal.SIGINT, signal.SIGTERM)
_PENDING: list[int] = []              # signals received inside raised(), newest last
_CLEANUPS: list[Callable[[], None]] = []
_LABEL = ["megakernel"]


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM arrived; ``signum`` says which."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


_OPEN_LINE = [False]                  # a progress line waits for its time (cli_args.progress)


def line_open(is_open: bool) -> bool:
    """Note whether a progress line is open; returns whether it was (False
    once an interrupt's message has ended it)."""
    was, _OPEN_LINE[0] = _OPEN_LINE[0], is_open
    return was


def message(signum: int) -> str:
    """The one line a command prints when a signal stops it (after ending an
    open progress line, so it stands on a line of its own)."""
    start = "\n" if _OPEN_LINE[0] else ""
    _OPEN_LINE[0] = False
    return (f"{start}{_LABEL[0]}: interrupted by {signal.Signals(signum).name}; stopped, "
            "and left no partial output")


def _on_signal(signum, frame):
    _PENDING.append(signum)   # kept in case the exception below is swallowed
    if _CLEANUPS:
        signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)   # no second signal mid-cleanup
        for cleanup in reversed(_CLEANUPS):
            with contextlib.suppress(Exception):
                cleanup()
        with contextlib.suppress(Exception):
            sys.stdout.flush()
        # Straight to the file descriptor: the signal may have landed inside a
        # write to sys.stderr (a reader that stopped reading), and a second
        # write through its buffer would fail as re-entrant, losing the line.
        with contextlib.suppress(OSError):
            os.write(sys.stderr.fileno(), (message(signum) + "\n").encode())
        os._exit(128 + signum)
    raise Interrupted(signum)


def checkpoint() -> None:
    """Raise ``Interrupted`` if a signal arrived whose exception was swallowed."""
    if _PENDING:
        raise Interrupted(_PENDING[-1])


@contextmanager
def raised(label: str = "megakernel") -> Iterator[None]:
    """Handle SIGINT and SIGTERM inside the block (see the module docstring);
    ``label`` starts the line printed. A signal the caller ignores (nohup, a
    background job) stays ignored; outside the main thread, where handlers
    cannot be set, nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {}
    hook = sys.unraisablehook

    def unraisable(info):
        if not isinstance(info.exc_value, Interrupted):   # else: kept in _PENDING
            hook(info)

    _PENDING.clear()
    _LABEL[0] = label
    sys.unraisablehook = unraisable
    for sig in SIGNALS:
        if signal.getsignal(sig) is not signal.SIG_IGN:
            previous[sig] = signal.signal(sig, _on_signal)
    try:
        yield
        checkpoint()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        sys.unraisablehook = hook
        _PENDING.clear()


@contextmanager
def exit_on_signal(cleanup: Callable[[], None]) -> Iterator[None]:
    """Inside the block, a signal runs ``cleanup`` and exits at once (code
    128 + signal number) instead of raising. ``cleanup`` must be safe to run at
    any point of the block, and more than once."""
    with held():
        _CLEANUPS.append(cleanup)
    try:
        yield
    finally:
        with held():
            _CLEANUPS.remove(cleanup)


@contextmanager
def held() -> Iterator[None]:
    """Defer SIGINT and SIGTERM until the block ends (then they are delivered)."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
