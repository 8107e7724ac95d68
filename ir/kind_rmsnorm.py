"""RMS normalisation: the ``RMSNorm`` op kind (over the hidden vector, or per
head for q/k norms; the norm over all heads split across cores is the
two-part norm of ir/kind_norm_parts.py).

After import: ``RMSNorm`` is registered in ``OP_KINDS`` (kind ``rmsnorm``);
ir/ops.py re-exports it.
"""

from __future__ import annotations

from typing import ClassVar

from megakernel.errors import IRError
from megakernel.ir import limits
from megakernel.ir.op_base import OP_KINDS, Op
from megakernel.ir.op_fields import Dim, _fail
from megakernel.ir.schema import Bool, Float, node
from megakernel.ir.types import ParamSpec


@node
class RMSNorm(Op):
    """y = x / rms(x) * w over groups of ``dim`` features (``dim`` = the whole
    vector, or a head for qk-norm). With ``offset`` the scale is (1 + w).
    Without ``weight`` the norm is parameter-free, y = x / rms(x) (Muse
    Spark's QK, attention-output, post-attention and embedding norms)."""

    kind: ClassVar[str] = "rmsnorm"
    dim: Dim
    eps: Float(*limits.NORM_EPS) = 1e-6
    offset: Bool = False
    weight: Bool = True

    def __post_init__(self):
        # An offset is added to the weight: without one it would be ignored.
        if self.offset and not self.weight:
            raise _fail("offset", "offset=True scales by (1 + weight), but weight=False: "
                        "set one of them the other way")

    def params(self, dtype):
        return {"weight": ParamSpec((self.dim,), dtype)} if self.weight else {}

    def infer(self, inputs):
        (shape,) = inputs
        if len(shape) != 1 or shape[0] % self.dim:
            raise IRError(f"input of {shape[0] if shape else shape} features is not "
                          f"a whole number of groups of dim={self.dim}", path=self.kind)
        return (shape,)


OP_KINDS.register(RMSNorm.kind)(RMSNorm)
