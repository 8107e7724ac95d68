"""Op kinds of the layer graph: frozen parameter records, checked when built.

An op knows its own weights (``params``), the state it keeps between steps
(``state``) and the per-token shapes it maps (``infer``); it knows nothing of
layers, sharding or code generation. ``OP_KINDS`` finds an op's class by its
kind; every later stage finds its rule for the kind in its own registry
(``megakernel.registry``). Each kind is defined and registered in its
``ir/kind_*.py`` (docs/architecture.md, "Adding an op kind"), the projection
(``Linear``) and the residual ``Add`` in ir/op_base.py. This module
re-exports the core kinds' classes, ``Op``, ``Linear``, ``Add``, the field
types (ir/op_fields.py) and rotary scaling (ir/rope_scaling.py), so
``megakernel.ir.ops.Attention`` still names its class, and reads an op back
from its dict (``op_from_dict``).
"""

from __future__ import annotations

from typing import Any

from megakernel.errors import IRError, shown
from megakernel.ir.kind_attention import Attention, Rope  # noqa: F401
from megakernel.ir.kind_mlp import MLP  # noqa: F401
from megakernel.ir.kind_moe import MoE  # noqa: F401
from megakernel.ir.kind_rmsnorm import RMSNorm  # noqa: F401
from megakernel.ir.op_base import OP_KINDS, Add, Linear, Op, _encode, _expect_shapes  # noqa: F401
from megakernel.ir.op_fields import (Activation, Dim, FreqFactor, HeadDim, Heads,  # noqa: F401
                                     Positions, Scoring, _fail)
from megakernel.ir.rope_scaling import (RopeScaling, _yarn_inv_freq, _yarn_mscale,  # noqa: F401
                                        rope_attention_factor, rope_inv_freq)
from megakernel.ir.schema import Bool, Float, Int, node  # noqa: F401
from megakernel.ir.types import APPEND, DType, ParamSpec, StateSpec  # noqa: F401


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
