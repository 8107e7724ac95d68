"""The project's errors: one hierarchy, each error naming the place it is about.

Every error carries a dotted ``path`` to the thing that is wrong
(``layers.3.attention``, ``config.num_experts``, ``shard.layers.0.q_proj``) and a
``hint`` saying what the user can change. ``str(err)`` reads
``layers.3.attention: num_q_heads=28 is not a multiple of num_kv_heads=6``.
"""

from __future__ import annotations

import contextlib
import reprlib
from collections.abc import Iterator

# Bounds on what an error echoes: a model file may hold a 20 MB string or a list
# nested 10,000 deep, and an error must stay one readable paragraph.
MAX_MESSAGE_CHARS = 2000
MAX_PATH_CHARS = 200
_REPR = reprlib.Repr(maxlevel=2, maxtuple=4, maxlist=4, maxarray=4, maxdict=4, maxset=4,
                     maxfrozenset=4, maxdeque=4, maxstring=60, maxlong=40, maxother=60)


def shown(value) -> str:
    """``repr(value)`` cut to a bounded length (nesting, items and characters)."""
    try:
        return _REPR.repr(value)
    except (ValueError, RecursionError):
        # int -> str refuses more than 4300 digits; say what it is instead.
        return f"<{type(value).__name__}>"


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 20] + f"... ({len(text):,} chars)"


class MegakernelError(Exception):
    """Base class of every error this project raises on purpose."""

    def __init__(self, message: str, *, path: str = "", hint: str = ""):
        self.message = _cut(str(message), MAX_MESSAGE_CHARS)
        self.path = _cut(str(path), MAX_PATH_CHARS)
        self.hint = _cut(str(hint), MAX_MESSAGE_CHARS)
        super().__init__(self._render())

    def _render(self) -> str:
        text = f"{self.path}: {self.message}" if self.path else self.message
        if self.hint:
            text += f" ({self.hint})"
        return text

    def prefixed(self, prefix: str) -> "MegakernelError":
        """The same error with ``prefix`` put in front of its path."""
        path = f"{prefix}.{self.path}" if self.path else prefix
        err = type(self)(self.message, path=path, hint=self.hint)
        err.__cause__ = self.__cause__
        return err


class IRError(MegakernelError, ValueError):
    """A model description or layer graph is invalid."""


class ConfigError(IRError):
    """A Hugging Face config.json or model file cannot be imported."""


class ShardingError(MegakernelError, ValueError):
    """The model cannot be split over the requested TensorCores."""


class PlanningError(MegakernelError, ValueError):
    """No memory plan or schedule fits the target."""


class EmitError(MegakernelError):
    """Code generation failed, or the generated module does not load or compile."""


class CheckError(MegakernelError):
    """The kernel disagrees with the reference."""


class SetupError(MegakernelError):
    """The environment cannot run a check: too few virtual devices, no libtpu, a
    model that does not plan for the requested TensorCores. Not a property of
    any drawn case; the hint says what to set or change."""


@contextlib.contextmanager
def error_context(prefix: str) -> Iterator[None]:
    """Prefix the path of any project error raised inside the block."""
    try:
        yield
    except MegakernelError as err:
        raise err.prefixed(prefix) from err.__cause__
