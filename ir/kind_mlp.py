"""The dense feed-forward block: the ``MLP`` op kind and the card's dense FFN.

After import: ``MLP`` is registered in ``OP_KINDS`` (kind ``mlp``; ir/ops.py
re-exports it), and the card's ``dense`` FFN (its block and size formula) in
``FFNS`` (ir/card.py).
"""

from __future__ import annotations

from typing import ClassVar

from megakernel.ir import sizes
from megakernel.ir.blocks import LayerBuilder
from megakernel.ir.card import FFN, FFNS, ModelConfig
from megakernel.ir.op_base import OP_KINDS, Op, _expect_shapes
from megakernel.ir.op_fields import Activation, Dim
from megakernel.ir.schema import Bool, node
from megakernel.ir.types import ParamSpec


@node
class MLP(Op):
    """Feed-forward block: down(act(gate(x)) * up(x)) when ``gated`` (SwiGLU,
    GeGLU), else down(act(up(x)))."""

    kind: ClassVar[str] = "mlp"
    hidden: Dim
    intermediate: Dim
    activation: Activation = Activation.SILU
    gated: Bool = True

    def params(self, dtype):
        h, i = self.hidden, self.intermediate
        p = {"up": ParamSpec((h, i), dtype), "down": ParamSpec((i, h), dtype)}
        if self.gated:
            p = {"gate": ParamSpec((h, i), dtype), **p}
        return p

    def infer(self, inputs):
        _expect_shapes(self, inputs, ((self.hidden,),))
        return ((self.hidden,),)


OP_KINDS.register(MLP.kind)(MLP)


def _mlp_block(c: ModelConfig, b: LayerBuilder, hn: str) -> str:
    """The card's dense FFN: one MLP op of the card's width and activation."""
    return b.add("mlp", lambda: MLP(c.hidden_size, c.intermediate_size, c.activation), (hn,),
                 "ffn_out")


def _mlp_sizes(c: ModelConfig) -> int:
    """Weight bytes of one dense FFN: gate, up and down."""
    return 3 * c.hidden_size * c.intermediate_size * sizes.item_size(c)


FFNS.register("dense")(FFN(_mlp_block, _mlp_sizes))
