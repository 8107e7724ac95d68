"""An RMSNorm in two parts, for a norm whose group is cut over cores.

OLMo 2 normalises the whole q (and k) projection, all heads together, before
the heads are split; under tensor parallelism each core holds only its heads.
``mean_square`` gives each token's mean of squares over ``dim`` features, a
[1] tensor per token: on a core holding a slice it is that slice's share (a
partial sum), so the sharding pass all-reduces it like any partial sum before
``rms_scale`` reads it. ``rms_scale`` is ``x * rsqrt(ms + eps) * w`` (or
``(1 + w)`` with ``offset``), per feature, so x and w stay split.
"""

from __future__ import annotations

from typing import ClassVar

from megakernel.errors import IRError
from megakernel.ir import limits
from megakernel.ir.op_base import OP_KINDS, Op
from megakernel.ir.op_fields import Dim
from megakernel.ir.weight_kinds import WEIGHT_KINDS
from megakernel.ir.schema import Bool, Float, node
from megakernel.ir.types import ParamSpec


@node
class MeanSquare(Op):
    """ms = mean(x^2) over the ``dim`` features of x: [dim] -> [1]."""

    kind: ClassVar[str] = "mean_square"
    dim: Dim

    def infer(self, inputs):
        if list(inputs) != [(self.dim,)]:
            raise IRError(f"input has per-token shape {list(inputs)}, expected "
                          f"[({self.dim},)]", path=self.kind)
        return ((1,),)


@node
class RMSScale(Op):
    """y = x * rsqrt(ms + eps) * w (``offset``: (1 + w)); inputs x [dim], ms [1]."""

    kind: ClassVar[str] = "rms_scale"
    dim: Dim
    eps: Float(*limits.NORM_EPS) = 1e-6
    offset: Bool = False

    def params(self, dtype):
        return {"weight": ParamSpec((self.dim,), dtype)}

    def infer(self, inputs):
        if list(inputs) != [(self.dim,), (1,)]:
            raise IRError(f"inputs have per-token shapes {list(inputs)}, expected "
                          f"[({self.dim},), (1,)] (x and its mean square)", path=self.kind)
        return ((self.dim,),)


for _cls in (MeanSquare, RMSScale):
    OP_KINDS.register(_cls.kind)(_cls)
    WEIGHT_KINDS.register(_cls.kind)(lambda op: {})     # no matrices
