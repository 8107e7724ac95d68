"""Op kinds of the layer graph: frozen parameter records, checked when built.

An op knows its own weights (``params``), the state it keeps between steps
(``state``) and the per-token shapes it maps (``infer``); it knows nothing of
layers, sharding or code generation. ``OP_KINDS`` finds an op's class by its
kind; every later stage finds its rule for the kind in its own registry
(``megakernel.registry``). The core kinds are registered here: the small
ones defined here, the others in the family modules below (``Op`` itself in
ir/op_base.py, field types in ir/op_fields.py, rotary scaling in
ir/rope_scaling.py), all re-exported; other kinds live in ``ir/kind_*.py``
(docs/architecture.md, "Adding an op kind").
"""

from __future__ import annotations

from typing import Any, ClassVar

from megakernel.errors import IRError, shown
from megakernel.ir import limits
from megakernel.ir.attention_ops import Attention, Rope  # noqa: F401
from megakernel.ir.ffn_ops import MLP, MoE  # noqa: F401
from megakernel.ir.op_base import Op, _encode, _expect_shapes  # noqa: F401
from megakernel.ir.op_fields import (Activation, Dim, FreqFactor, HeadDim, Heads,  # noqa: F401
                                     Positions, Scoring, _fail)
from megakernel.ir.rope_scaling import (RopeScaling, _yarn_inv_freq, _yarn_mscale,  # noqa: F401
                                        rope_attention_factor, rope_inv_freq)
from megakernel.ir.schema import Bool, Float, Int, node  # noqa: F401
from megakernel.ir.types import APPEND, DType, ParamSpec, StateSpec  # noqa: F401
from megakernel.registry import Registry


@node
class RMSNorm(Op):
    """y = x / rms(x) * w over groups of ``dim`` features (``dim`` = the whole
    vector, or a head for qk-norm). With ``offset`` the scale is (1 + w)."""

    kind: ClassVar[str] = "rmsnorm"
    dim: Dim
    eps: Float(*limits.NORM_EPS) = 1e-6
    offset: Bool = False

    def params(self, dtype):
        return {"weight": ParamSpec((self.dim,), dtype)}

    def infer(self, inputs):
        (shape,) = inputs
        if len(shape) != 1 or shape[0] % self.dim:
            raise IRError(f"input of {shape[0] if shape else shape} features is not "
                          f"a whole number of groups of dim={self.dim}", path=self.kind)
        return (shape,)


@node
class Linear(Op):
    """y = x @ W (+ b); W is stored [in_features, out_features]."""

    kind: ClassVar[str] = "linear"
    in_features: Dim
    out_features: Dim
    bias: Bool = False

    def params(self, dtype):
        p = {"weight": ParamSpec((self.in_features, self.out_features), dtype)}
        if self.bias:
            p["bias"] = ParamSpec((self.out_features,), dtype)
        return p

    def infer(self, inputs):
        _expect_shapes(self, inputs, ((self.in_features,),))
        return ((self.out_features,),)


@node
class Add(Op):
    """Residual add of two tensors of the same shape."""

    kind: ClassVar[str] = "add"

    def infer(self, inputs):
        if len(inputs) != 2 or inputs[0] != inputs[1]:
            raise IRError(f"add needs two inputs of one shape, found {list(inputs)}",
                          path=self.kind)
        return (inputs[0],)


# The op class of every kind; kind modules register theirs (ir/__init__.py imports them).
OP_KINDS: Registry[type[Op]] = Registry("op kind", "ir/ops.py or an ir/kind_*.py module")
for _cls in (RMSNorm, Linear, Rope, Attention, MLP, MoE, Add):
    OP_KINDS.register(_cls.kind)(_cls)


def op_from_dict(data: Any) -> Op:
    """Rebuild an op from ``Op.to_dict`` output; unknown kinds or fields, and
    values of the wrong type or range, are errors naming the field."""
    if not isinstance(data, dict):
        raise IRError(f"expected an object with a kind, found {shown(data)}",
                      hint=f'write {{"kind": ..., ...}} with a kind of {sorted(OP_KINDS)}')
    data = dict(data)
    kind = data.pop("kind", None)
    if not isinstance(kind, str) or kind not in OP_KINDS:
        raise IRError(f"unknown op kind {shown(kind)}; known: {sorted(OP_KINDS)}", path="kind")
    err: IRError | None = None
    try:
        return OP_KINDS(kind)(**data)
    except IRError as caught:
        err = caught
    raise err.prefixed(kind)
