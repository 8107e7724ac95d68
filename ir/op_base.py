"""The base of every op kind: ``Op`` and the shape check its kinds share.

After import: ``Op`` is the frozen, checked record every kind subclasses
(``params``, ``state``, ``rows_read``, ``infer``, ``to_dict``), and
``_expect_shapes`` the error a kind's ``infer`` raises on inputs of the
wrong per-token shapes; ``OP_KINDS`` the table of every kind's class. The
kinds live in ir/kind_*.py, each registering its class, except the
projection (``Linear``) and the residual ``Add``: every layer is built of
them and every stage is written around them, so they are defined and
registered here, below every kind module (whose card blocks use them).
ir/ops.py re-exports all of this.
"""

from __future__ import annotations

import enum
from dataclasses import fields
from typing import ClassVar

from megakernel.errors import IRError
from megakernel.ir.op_fields import Dim
from megakernel.ir.rope_scaling import RopeScaling
from megakernel.ir.schema import Bool, node
from megakernel.ir.types import DType, ParamSpec, StateSpec
from megakernel.registry import Registry


def _expect_shapes(op: "Op", found: tuple[tuple[int, ...], ...],
                   expected: tuple[tuple[int, ...], ...]) -> None:
    if tuple(found) != tuple(expected):
        raise IRError(f"inputs have per-token shapes {list(found)}, expected "
                      f"{list(expected)}", path=op.kind)


@node
class Op:
    """Base of all op kinds. ``kind`` names the op in tables and JSON."""

    kind: ClassVar[str] = "op"
    # The accesses (APPEND / WHOLE) of the state ``state`` declares, known from
    # the class: start-up checks (megakernel/kinds.py) read which per-state
    # tables a kind needs without building one (tests/test_registry.py holds
    # every zoo op's ``state`` to it).
    STATE_ACCESS: ClassVar[frozenset[str]] = frozenset()
    # The name of the kind's kernel library (backends/pallas_tpu/kernels/<LIBRARY>.py)
    # and of its geometry record; None for kinds computed on values. Start-up
    # checks read from it which kinds need a geometry record and a library
    # import, under that name (tests/compiler hold each BUFFERS rule to it).
    LIBRARY: ClassVar[str | None] = None
    # Errors name the op (``layers.0.attention``); the message names the field.
    FLAT_ERRORS: ClassVar[bool] = True
    # The op adds a branch into the residual stream (the residual add, a
    # residual gate): random weights draw the branch's last projection at the
    # residual scale (models/weights.py), so deep stacks stay O(1).
    RESIDUAL: ClassVar[bool] = False

    def params(self, dtype: DType) -> dict[str, ParamSpec]:
        return {}

    def state(self, batch: int, max_seq_len: int, dtype: DType) -> dict[str, StateSpec]:
        """What this op keeps between decode steps (KV caches, recurrent state),
        by name; the planner, packer, kernel and reference all read this."""
        return {}

    def rows_read(self, valid: int, tokens: int) -> int:
        """Rows of an appended state one step reads per sequence, when ``valid``
        rows (the new ``tokens`` included) are in it."""
        return valid

    def infer(self, inputs: tuple[tuple[int, ...], ...]) -> tuple[tuple[int, ...], ...]:
        raise NotImplementedError

    def to_dict(self) -> dict:
        out = {"kind": self.kind}
        for f in fields(self):
            out[f.name] = _encode(getattr(self, f.name))
        return out


def _encode(value):
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, RopeScaling):
        return {f.name: getattr(value, f.name) for f in fields(value)}
    return value


# The op class of every kind: each kind's module registers its class
# (ir/__init__.py imports them all); ir/ops.py re-exports the table.
OP_KINDS: Registry[type[Op]] = Registry("op kind", "ir/kind_*.py (linear, add: ir/op_base.py)")


@node
class Linear(Op):
    """y = x @ W (+ b); W is stored [in_features, out_features].
    ``split_rows``: where its input is held whole by every core, the planner
    splits W's rows anyway (each core multiplies its slice of the input by its
    rows; the partial sums are all-reduced after), so each core streams 1/N of
    a big projection between replicated tensors for one all-reduce (the
    latent MoE's projections, ir/kind_moe.py)."""

    kind: ClassVar[str] = "linear"
    in_features: Dim
    out_features: Dim
    bias: Bool = False
    split_rows: Bool = False

    def to_dict(self) -> dict:
        out = super().to_dict()
        if not self.split_rows:      # earlier graphs keep their JSON, plans their digests
            del out["split_rows"]
        return out

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
    RESIDUAL: ClassVar[bool] = True

    def infer(self, inputs):
        if len(inputs) != 2 or inputs[0] != inputs[1]:
            raise IRError(f"add needs two inputs of one shape, found {list(inputs)}",
                          path=self.kind)
        return (inputs[0],)


for _cls in (Linear, Add):
    OP_KINDS.register(_cls.kind)(_cls)
