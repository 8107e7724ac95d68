"""Per-kind rule tables: one ``Registry`` per layer of the compiler.

Every stage that treats op kinds differently (the reference, weight init,
sharding, buffers, cost, emission, operands) keeps one registry and registers
one rule per op kind, in the manner of Pallas' lowering rules. Looking up a
kind that has no rule is a ``MissingRuleError`` naming the rule, the kind and
the node, never a silent default:

    no cost rule for op kind 'gated_deltanet' (layers[3].mixer)

Adding an op kind is therefore a list of registrations (docs/architecture.md,
"Adding an op kind"), and ``missing(kind)`` tells which are still absent.
Each kind brings one module per layer (``ir/kind_*.py``,
``models/kind_*.py``, ...), imported by that layer's package ``__init__``;
only the projection (``linear``) and the residual ``add``, which every layer
is made of, register in the stage modules themselves. The registry imports
nothing above it: the entry points (the CLI, the test kit's pytest plugin,
bench) import ``megakernel.kinds``, which imports every layer and then
checks, with ``check_complete``, that every kind has every rule it needs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

from megakernel.errors import MegakernelError

Rule = TypeVar("Rule", bound=Callable)

_ALL: list["Registry"] = []
_LOADED = False


def mark_loaded() -> None:
    """Called by megakernel/kinds.py once every kind module is imported."""
    global _LOADED
    _LOADED = True


def _not_loaded_hint() -> str:
    return ("" if _LOADED else "; only the layers imported so far have registered their "
            "kinds: import megakernel.kinds first (the CLI, the pytest plugin and bench do)")


class MissingRuleError(MegakernelError, LookupError):
    """A stage met an op kind it has no rule for."""


class Registry(Generic[Rule]):
    """The ``rule`` rules (e.g. "cost") of every op kind that has one; ``home``
    is the module that registers them (named in the error). A table keyed by
    something else than op kinds (the card's mixers) says ``per_op_kind=False``
    and what its keys are (``keyed_by="mixer"``)."""

    def __init__(self, rule: str, home: str, *, per_op_kind: bool = True,
                 needed_by: Callable[[type], bool] | None = None, need: str = "",
                 key_of: Callable[[type], str] | None = None, keyed_by: str = "op kind"):
        """``needed_by``: for a table only some op kinds need (``per_op_kind``
        False), which ones, from the kind's op class (``need`` says it in words);
        ``check_complete`` holds those kinds to it at start-up. ``key_of``: for
        such a table keyed by something else than the kind (a kernel library's
        name), the key a needing kind's class must have a rule under.
        ``keyed_by``: what the table's keys are, as a missing rule's error
        names them (``no override rule for override field 'mla_form'``)."""
        self.rule, self.home, self.per_op_kind = rule, home, per_op_kind
        self.needed_by, self.need, self.key_of = needed_by, need, key_of
        self.keyed_by = keyed_by
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
        try:
            return self._rules[kind]
        except KeyError:
            place = f" ({where})" if where else ""
            raise MissingRuleError(
                f"no {self.rule} rule for {self.keyed_by} {kind!r}{place}",
                hint=f"register one in {self.home}; {self.keyed_by}s with one: "
                     f"{', '.join(sorted(self._rules))}{_not_loaded_hint()}") from None

    def __contains__(self, kind: str) -> bool:
        return kind in self._rules

    def __getitem__(self, kind: str) -> Rule:
        return self(kind)

    def kinds(self) -> frozenset[str]:
        return frozenset(self._rules)

    def items(self):
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
    return [r.rule for r in _ALL if r.per_op_kind and kind not in r]


def gaps(op_classes: dict[str, type]) -> list[str]:
    """Every (rule, kind) still missing: each op kind of ``op_classes`` (kind ->
    its op class) against every per-kind table, and against each table only
    some kinds need where its ``needed_by`` says this kind does."""
    out = []
    for r in _ALL:
        for kind, cls in sorted(op_classes.items()):
            needed = r.per_op_kind or (r.needed_by is not None and r.needed_by(cls))
            key = r.key_of(cls) if r.key_of is not None and not r.per_op_kind else kind
            if needed and key not in r._rules:
                why = f" ({r.need})" if r.need and not r.per_op_kind else ""
                under = f" under {key!r}" if key != kind else ""
                out.append(f"no {r.rule} rule for op kind {kind!r}{why}{under}: "
                           f"register one in {r.home}")
    return out


def check_complete(op_classes: dict[str, type]) -> None:
    """Start-up check (megakernel/kinds.py): every kind has every rule it needs,
    else one MissingRuleError listing each gap."""
    missing_rules = gaps(op_classes)
    if missing_rules:
        raise MissingRuleError(f"{len(missing_rules)} rule(s) missing: " + "; ".join(missing_rules),
                               hint="docs/architecture.md, 'Adding an op kind', lists every "
                                    "registry and the module that registers into it")
