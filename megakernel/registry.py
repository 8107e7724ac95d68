"""Per-kind rule tables: one ``Registry`` per layer of the compiler.

Every stage that treats op kinds differently (the reference, weight init,
sharding, buffers, cost, emission, operands) keeps one registry and registers
one rule per op kind, in the manner of Pallas' lowering rules. Looking up a
kind that has no rule is a ``MissingRuleError`` naming the rule, the kind and
the node, never a silent default:

    no cost rule for op kind 'gated_deltanet' (layers[3].mixer)

Adding an op kind is therefore a list of registrations (docs/architecture.md,
"Adding an op kind"), and ``missing(kind)`` tells which are still absent.
The core kinds register in each stage's own module; other kinds bring one
module per layer (``ir/kind_*.py``, ``models/kind_*.py``, ...), all listed in
``megakernel/kinds.py``, which every registry imports before its first lookup.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

from megakernel.errors import MegakernelError

Rule = TypeVar("Rule", bound=Callable)

_ALL: list["Registry"] = []
_LOADED = False


def _load_kinds() -> None:
    """Import every kind module once, so each registry holds all its rules."""
    global _LOADED
    if not _LOADED:
        _LOADED = True
        import megakernel.kinds  # noqa: F401 - registers the kinds' rules


class MissingRuleError(MegakernelError, LookupError):
    """A stage met an op kind it has no rule for."""


class Registry(Generic[Rule]):
    """The ``rule`` rules (e.g. "cost") of every op kind that has one; ``home``
    is the module that registers them (named in the error). A table keyed by
    something else than op kinds (the card's mixers) says ``per_op_kind=False``."""

    def __init__(self, rule: str, home: str, *, per_op_kind: bool = True):
        self.rule, self.home, self.per_op_kind = rule, home, per_op_kind
        self._rules: dict[str, Rule] = {}
        _ALL.append(self)

    def register(self, *kinds: str) -> Callable[[Rule], Rule]:
        """Decorator: ``fn`` is the rule of each of ``kinds``."""
        def add(fn: Rule) -> Rule:
            for kind in kinds:
                if kind in self._rules:
                    raise ValueError(f"{self.rule} rule for {kind!r} registered twice")
                self._rules[kind] = fn
            return fn
        return add

    def __call__(self, kind: str, where: str = "") -> Rule:
        """The rule of ``kind``; ``where`` names the node for the error."""
        _load_kinds()
        try:
            return self._rules[kind]
        except KeyError:
            place = f" ({where})" if where else ""
            raise MissingRuleError(
                f"no {self.rule} rule for op kind {kind!r}{place}",
                hint=f"register one in {self.home}; kinds with one: "
                     f"{', '.join(sorted(self._rules))}") from None

    def __contains__(self, kind: str) -> bool:
        _load_kinds()
        return kind in self._rules

    def __getitem__(self, kind: str) -> Rule:
        return self(kind)

    def kinds(self) -> frozenset[str]:
        _load_kinds()
        return frozenset(self._rules)

    def items(self):
        _load_kinds()
        return sorted(self._rules.items())

    def values(self):
        return [rule for _, rule in self.items()]

    def __iter__(self):
        return iter(sorted(self.kinds()))

    def __len__(self) -> int:
        return len(self.kinds())


def registries() -> tuple[Registry, ...]:
    """Every registry created so far (import the stages first)."""
    return tuple(_ALL)


def missing(kind: str) -> list[str]:
    """Names of the rules op kind ``kind`` still lacks, over every registry
    keyed by op kind (tables keyed otherwise, like the card's mixers, aside)."""
    _load_kinds()
    return [r.rule for r in _ALL if r.per_op_kind and kind not in r]
