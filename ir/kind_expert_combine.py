"""The routed experts' combine: the ``expert_combine`` op kind.

A MoE op with ``per_slot`` (ir/kind_moe.py) emits each row's picked experts'
outputs unweighted, one slot of ``hidden`` features per pick (ascending
expert id), and the slots' routing weights. This op sums them:

    out = sum_k w_k * norm(y_k)      (norm: Muse Spark's per-expert output norm)

with norm(y) = rms(y) * s (eps ``norm_eps``), or with ``norm_input_scaled``
rms(round(y * s)) (the product rounded to the model dtype), s = 1 + v with
``norm_offset``, else v, v the
learned ``weight`` [hidden]; without ``norm`` the plain weighted sum.

Why an op of its own: split over cores (each expert's FFN width, or the
experts), a slot is a partial sum, and the norm must read the whole slot. As
the node after the MoE op it does: the sharding rules all-reduce a partial
sum before any reader that needs it whole (compiler/kind_expert_combine.py),
an ordinary collective site between two nodes.

After import: ``ExpertCombine`` is registered in ``OP_KINDS`` (kind
``expert_combine``) with no quantizable matrices in ``WEIGHT_KINDS``.
"""

from __future__ import annotations

from typing import ClassVar

from megakernel.ir import limits
from megakernel.ir.op_base import OP_KINDS, Op, _expect_shapes
from megakernel.ir.op_fields import Dim, _fail
from megakernel.ir.schema import Bool, Float, Int, node
from megakernel.ir.types import ParamSpec
from megakernel.ir.weight_kinds import WEIGHT_KINDS


@node
class ExpertCombine(Op):
    """out [hidden] = sum over ``top_k`` slots of weight * (normed) slot;
    inputs (slots [top_k * hidden], weights [top_k]); param ``weight``
    [hidden] with ``norm`` (module docstring)."""

    kind: ClassVar[str] = "expert_combine"
    hidden: Dim
    top_k: Int(1, limits.MAX_EXPERTS)
    norm: Bool = True
    norm_eps: Float(*limits.NORM_EPS) = 1e-6
    norm_input_scaled: Bool = False
    norm_offset: Bool = False

    def __post_init__(self):
        # Scaling and offset are the norm's: without one they would be ignored.
        for name in ("norm_input_scaled", "norm_offset"):
            if getattr(self, name) and not self.norm:
                raise _fail(name, f"{name}=True with norm=False: there is no norm to "
                            "scale; set norm=True or drop it")

    def params(self, dtype):
        return {"weight": ParamSpec((self.hidden,), dtype)} if self.norm else {}

    def infer(self, inputs):
        _expect_shapes(self, inputs, ((self.top_k * self.hidden,), (self.top_k,)))
        return ((self.hidden,),)


OP_KINDS.register(ExpertCombine.kind)(ExpertCombine)
WEIGHT_KINDS.register(ExpertCombine.kind)(lambda op: {})     # one norm vector, never quantized
