"""Which weight kind each matrix of an op is, for the card's ``quantize`` table.

Every op kind registers in ``WEIGHT_KINDS`` a rule ``op -> {param: kind}``
naming its quantizable matrices by weight kind (megakernel/formats.py
``KINDS``); a param it does not name (a norm weight, a bias, a conv tap,
a per-head sink) is always plain. A kind without a rule is a
``MissingRuleError``, so a new op kind must say what its matrices are.
``Quantize`` is the card's table: one format name per weight kind.
"""

from __future__ import annotations

from typing import ClassVar

from megakernel import formats
from megakernel.ir.schema import Word, node
from megakernel.ir.types import DType
from megakernel.registry import Registry

WEIGHT_KINDS: Registry = Registry("weight kind", "ir/weight_kinds.py or the kind's ir module")

WEIGHT_KINDS.register("rmsnorm", "rope", "attention", "add")(lambda op: {})
WEIGHT_KINDS.register("linear")(lambda op: {"weight": "dense"})
WEIGHT_KINDS.register("mlp")(lambda op: dict.fromkeys(op.params(DType.BF16), "dense"))


@WEIGHT_KINDS.register("moe")
def _moe(op):
    kinds = {"router": "router", "experts_gate": "experts", "experts_up": "experts",
             "experts_down": "experts"}
    if op.num_shared_experts:
        kinds.update(shared_gate="dense", shared_up="dense", shared_down="dense")
    return kinds


# Kinds whose name may mislead: a model without them is told what they are.
KIND_MEANS = {"attention": "an MLA layer's up-projections; other attention projections are "
                           "dense",
              "experts": "a MoE layer's routed experts",
              "router": "a MoE layer's router"}


@node
class Quantize:
    """A card's ``quantize`` block: the format of each weight kind (``plain``:
    the model dtype). Errors name ``quantize.{kind}``."""

    ERROR_PATH: ClassVar[str] = "quantize"

    dense: Word = "plain"
    attention: Word = "plain"
    router: Word = "plain"
    experts: Word = "plain"
    embedding: Word = "plain"
    lm_head: Word = "plain"

    def __post_init__(self):
        formats.check_table(self.table(), path="")

    def table(self) -> dict[str, str]:
        return {k: getattr(self, k) for k in formats.KINDS}

    def chosen(self) -> dict[str, str]:
        """The kinds that are not plain."""
        return {k: v for k, v in self.table().items() if v != "plain"}

    def format(self, kind: str | None) -> formats.Format:
        return formats.PLAIN if kind is None else formats.get(getattr(self, kind))

    @classmethod
    def parse(cls, pairs: list[str], *, path: str = "--quantize", model=None) -> "Quantize":
        """``["experts=mxfp4", "dense=int8"]`` (the CLI's repeatable flag): each
        kind once, and, given ``model``, only kinds that model has."""
        from megakernel.errors import IRError

        table = {}
        for pair in pairs:
            kind, sep, name = (part.strip() for part in pair.partition("="))
            if not sep or not kind or not name:
                raise IRError(f"expected KIND=FORMAT, found {pair!r}", path=path,
                              hint=f"kinds: {list(formats.KINDS)}; formats: "
                                   f"{sorted(formats.FORMATS)}")
            if kind in table:
                raise IRError(f"{kind} is given twice ({kind}={table[kind]}, then {kind}={name})",
                              path=f"{path}.{kind}", hint=f"give {kind} once")
            table[kind] = name
        if model is not None:
            has = model_kinds(model.layers)
            for kind in table:
                if kind in formats.KINDS and kind not in has:
                    what = f" ({KIND_MEANS[kind]})" if kind in KIND_MEANS else ""
                    raise IRError(f"{model.name} has no {kind} weights{what}; its weight kinds "
                                  f"are {', '.join(sorted(has))}", path=f"{path}.{kind}",
                                  hint=f"remove {kind}={table[kind]}")
        formats.check_table(table, path=path)
        return cls(**table)


def layer_formats(quantize: Quantize, layer) -> dict[str, str]:
    """{layer-local param name: format name} of ``layer``'s non-plain weights."""
    if not quantize.chosen():
        return {}
    out = {}
    for n in layer.nodes:
        for pname, kind in WEIGHT_KINDS(n.op.kind, n.name)(n.op).items():
            fmt = getattr(quantize, kind)
            if fmt != "plain":
                out[f"{n.name}.{pname}"] = fmt
    return out


def model_kinds(layers) -> set[str]:
    """The weight kinds a model of ``layers`` has (its embedding and LM head too)."""
    kinds = {"embedding", "lm_head"}
    for layer in set(layers):
        for n in layer.nodes:
            kinds.update(WEIGHT_KINDS(n.op.kind, n.name)(n.op).values())
    return kinds
