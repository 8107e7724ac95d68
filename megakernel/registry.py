"""Per-kind rule tables: one ``Registry`` per layer of the compiler.

Every stage that treats op kinds differently (the reference, weight init,
sharding, buffers, cost, emission, operands) keeps one registry and registers
one rule per op kind, in the manner of Pallas' lowering rules. Looking up a
kind that has no rule is a ``MissingRuleError`` naming the rule, the kind and
the node, never a silent default:

    no cost rule for op kind 'gated_deltanet' (layers[3].mixer)

Adding an op kind is therefore a list of registrations (docs/architecture.md,
"Adding an op kind"), and ``missing(kind)`` tells which are still absent.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

from megakernel.errors import MegakernelError

Rule = TypeVar("Rule", bound=Callable)

_ALL: list["Registry"] = []


class MissingRuleError(MegakernelError, LookupError):
    """A stage met an op kind it has no rule for."""


class Registry(Generic[Rule]):
    """The ``rule`` rules (e.g. "cost") of every op kind that has one; ``home``
    is the module that registers them (named in the error)."""

    def __init__(self, rule: str, home: str):
        self.rule, self.home = rule, home
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
                f"no {self.rule} rule for op kind {kind!r}{place}",
                hint=f"register one in {self.home}; kinds with one: "
                     f"{', '.join(sorted(self._rules))}") from None

    def __contains__(self, kind: str) -> bool:
        return kind in self._rules

    def kinds(self) -> frozenset[str]:
        return frozenset(self._rules)


def registries() -> tuple[Registry, ...]:
    """Every registry created so far (import the stages first)."""
    return tuple(_ALL)


def missing(kind: str) -> list[str]:
    """Names of the rules ``kind`` still lacks, over every loaded registry."""
    return [r.rule for r in _ALL if kind not in r]
