"""The learned residual gate: the ``residual_gate`` op kind (Muse Spark).

A block's residual add ``s + b`` becomes ``alpha * s + beta * b``, with per
feature coefficients from one learned f32 vector ``gate`` [dim]:

    u     = gate / temperature
    beta  = sigmoid(u)
    alpha = sqrt(max(sigmoid(-u) * (1 + beta), floor))

so that alpha^2 + beta^2 = 1 wherever the floor does not bind: the gate
trades residual for branch without growing the stream. Computed in f32, as
Hugging Face keeps the gate module in f32; the result has the residual's
dtype. The card's ``residual_gate_temperature`` makes both residual adds of
every layer gates (ir/blocks.py ``residual``).

After import: ``ResidualGate`` is registered in ``OP_KINDS`` (kind
``residual_gate``) with no quantizable matrices in ``WEIGHT_KINDS``.
"""

from __future__ import annotations

from typing import ClassVar

from megakernel.errors import IRError
from megakernel.ir import limits
from megakernel.ir.op_base import OP_KINDS, Op
from megakernel.ir.op_fields import Dim
from megakernel.ir.schema import Float, node
from megakernel.ir.types import DType, ParamSpec
from megakernel.ir.weight_kinds import WEIGHT_KINDS

# Hugging Face's MuseSparkResidualGate clamps alpha^2 at 1e-3 (its ``eps``).
DEFAULT_FLOOR = 1e-3


@node
class ResidualGate(Op):
    """y = alpha * s + beta * b over ``dim`` features; inputs (residual s,
    branch b), both [dim]; param ``gate`` [dim] f32 (module docstring)."""

    kind: ClassVar[str] = "residual_gate"
    RESIDUAL: ClassVar[bool] = True
    dim: Dim
    # A zero temperature divides by 0; a negative one swaps alpha and beta.
    temperature: Float(0.0, limits.MAX_SCALE, open_low=True)
    # alpha >= sqrt(floor): 0 lets alpha vanish, 1 pins it at >= 1.
    floor: Float(0.0, 1.0) = DEFAULT_FLOOR

    def params(self, dtype):
        return {"gate": ParamSpec((self.dim,), DType.F32)}

    def infer(self, inputs):
        if list(inputs) != [(self.dim,), (self.dim,)]:
            raise IRError(f"inputs have per-token shapes {list(inputs)}, expected "
                          f"[({self.dim},), ({self.dim},)] (residual and branch)",
                          path=self.kind)
        return (inputs[0],)


OP_KINDS.register(ResidualGate.kind)(ResidualGate)
WEIGHT_KINDS.register(ResidualGate.kind)(lambda op: {})     # one f32 vector, never quantized
