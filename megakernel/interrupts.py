"""Interrupts as exceptions: SIGINT and SIGTERM end a command through its cleanup.

By default SIGTERM kills the process where it stands, so a compile interrupted
that way would leave its half-written temporary folder behind. ``raised()``
turns both signals into ``Interrupted`` (a ``KeyboardInterrupt``, so no
``except Exception`` swallows it) for the block; every ``finally`` then runs.
``held()`` defers both signals for a critical section (renaming an output into
place, removing a temporary folder) and delivers them when it ends.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM arrived; ``signum`` says which."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _raise(signum, frame):
    raise Interrupted(signum)


@contextmanager
def raised() -> Iterator[None]:
    """SIGINT and SIGTERM raise ``Interrupted`` inside the block. A signal the
    caller ignores (nohup, a background job) stays ignored; outside the main
    thread, where handlers cannot be set, nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {}
    for sig in SIGNALS:
        if signal.getsignal(sig) is not signal.SIG_IGN:
            previous[sig] = signal.signal(sig, _raise)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@contextmanager
def held() -> Iterator[None]:
    """Defer SIGINT and SIGTERM until the block ends (then they are delivered)."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
