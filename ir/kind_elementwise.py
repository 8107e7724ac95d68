"""Generic elementwise op kinds, so that more models are descriptions, not code.

``mul`` multiplies two tensors; ``activation`` applies one function of the
activation table; ``scale`` multiplies by a constant; ``softcap`` is
``cap * tanh(x / cap)`` (Gemma 2's attention and final-logit soft-capping);
``channel_scale`` multiplies by a learned per-feature vector (or by one plus
it: the input scale of Muse Spark's input-scaled norm). Each maps
per-token shapes to themselves and keeps no state.
"""

from __future__ import annotations

from typing import ClassVar

from megakernel.errors import IRError
from megakernel.ir import limits
from megakernel.ir.op_base import OP_KINDS, Op
from megakernel.ir.op_fields import Activation, Dim
from megakernel.ir.weight_kinds import WEIGHT_KINDS
from megakernel.ir.schema import Bool, Float, node
from megakernel.ir.types import ParamSpec

# Multipliers and caps: finite, bounded, and never 0 (a zero cap divides by 0).
_Factor = Float(-limits.MAX_SCALE, limits.MAX_SCALE)
_Cap = Float(0.0, limits.MAX_SCALE, open_low=True)


def _same(op: Op, inputs, n: int):
    if len(inputs) != n or any(shape != inputs[0] for shape in inputs):
        raise IRError(f"needs {n} input(s) of one shape, found {list(inputs)}", path=op.kind)
    return (inputs[0],)


@node
class Mul(Op):
    """y = a * b, elementwise."""

    kind: ClassVar[str] = "mul"

    def infer(self, inputs):
        return _same(self, inputs, 2)


@node
class Activate(Op):
    """y = fn(x), one entry of the activation table (megakernel/activations.py)."""

    kind: ClassVar[str] = "activation"
    fn: Activation

    def infer(self, inputs):
        return _same(self, inputs, 1)


@node
class Scale(Op):
    """y = factor * x."""

    kind: ClassVar[str] = "scale"
    factor: _Factor

    def __post_init__(self):
        if self.factor == 0:
            raise IRError("factor=0 would zero the tensor; remove the op instead",
                          path="factor")

    def infer(self, inputs):
        return _same(self, inputs, 1)


@node
class Softcap(Op):
    """y = cap * tanh(x / cap): x kept within (-cap, cap), nearly unchanged near 0."""

    kind: ClassVar[str] = "softcap"
    cap: _Cap

    def infer(self, inputs):
        return _same(self, inputs, 1)


@node
class ChannelScale(Op):
    """y = x * w, with a learned w of ``dim`` features (e.g. a layer scale);
    with ``offset``, y = x * (1 + w) (the input scale of Muse Spark's
    input-scaled norm, a parameter-free RMSNorm after it)."""

    kind: ClassVar[str] = "channel_scale"
    dim: Dim
    offset: Bool = False

    def params(self, dtype):
        return {"weight": ParamSpec((self.dim,), dtype)}

    def infer(self, inputs):
        if list(inputs) != [(self.dim,)]:
            raise IRError(f"input has per-token shape {list(inputs)}, expected [({self.dim},)]",
                          path=self.kind)
        return inputs


for _cls in (Mul, Activate, Scale, Softcap, ChannelScale):
    OP_KINDS.register(_cls.kind)(_cls)
    WEIGHT_KINDS.register(_cls.kind)(lambda op: {})     # no matrices
