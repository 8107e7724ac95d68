"""The geometry of one routed-experts node on one core, the buffers its kernel
library (backends/pallas_tpu/kernels/moe.py) needs - the expert slots, with
their scales for quantized experts - and the bytes of values it holds."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from megakernel import formats
from megakernel.compiler.buffers import Need, Space
from megakernel.compiler.plan_json import GEOMETRIES, OMIT_DEFAULT
from megakernel.errors import PlanningError


def _omitted(default):
    return dataclasses.field(default=default, metadata={OMIT_DEFAULT: True})


@GEOMETRIES.register("moe")
@dataclass(frozen=True)
class MoEGeometry:
    rows: int
    rows_padded: int
    hidden: int
    num_experts: int
    experts_local: int
    inter_local: int
    top_k: int
    scoring: str
    correction_bias: bool
    renormalize: bool
    routed_scaling: float
    activation: str
    slots: int
    dtype: str
    chunk: int
    router_logit_bias: bool = False
    expert_bias: bool = False
    swiglu_limit: float | None = None
    swiglu_alpha: float = 1.0
    n_group: int = 1
    topk_group: int = 1
    # Quantized experts (megakernel/formats.py): the slots hold codes as 32-bit
    # words and their f32 scales beside them; ``dtype`` is what they dequantise to.
    fmt: str = dataclasses.field(default="", metadata={OMIT_DEFAULT: True})
    # Muse Spark's router and per-expert output norm (ir/kind_moe.py MoE); left
    # out of plan.json at their defaults, so earlier plans keep their digests.
    router_logit_scale: float = _omitted(1.0)
    renormalize_eps: float = _omitted(0.0)
    expert_output_norm: bool = _omitted(False)
    expert_output_norm_eps: float = _omitted(1e-6)
    expert_output_norm_input_scaled: bool = _omitted(False)
    expert_output_norm_offset: bool = _omitted(False)
    # each pick's output apart, for an expert_combine node (ir/kind_moe.py)
    per_slot: bool = _omitted(False)

    def __post_init__(self):
        checks = [
            (self.chunk > 0 and self.inter_local % self.chunk == 0,
             f"chunk={self.chunk} does not divide inter_local={self.inter_local}"),
            (1 <= self.top_k <= self.num_experts, f"top_k={self.top_k} not in 1..{self.num_experts}"),
            (self.slots >= 1, f"slots={self.slots} must be >= 1"),
            (self.experts_local <= self.num_experts,
             f"experts_local={self.experts_local} exceeds num_experts={self.num_experts}"),
            (self.rows <= self.rows_padded and self.rows_padded % 8 == 0,
             f"rows_padded={self.rows_padded} must be a multiple of 8 >= rows={self.rows}"),
            (self.scoring in ("softmax", "sigmoid"), f"scoring={self.scoring!r} is unknown"),
            (self.n_group >= 1 and self.num_experts % self.n_group == 0
             and 1 <= self.topk_group <= self.n_group
             and (self.n_group == 1 or self.num_experts // self.n_group >= 2),
             f"n_group={self.n_group}, topk_group={self.topk_group} do not split "
             f"num_experts={self.num_experts} into groups of at least 2"),
        ]
        for ok, message in checks:
            if not ok:
                raise PlanningError(message, path="moe.geometry")

    @property
    def chunks(self) -> int:
        return self.inter_local // self.chunk


def value_bytes(g: MoEGeometry, ss, node) -> int:
    """Bytes of values ``moe_routed`` and the shared expert hold at their peak:
    router logits, scores, picks and weights ([rows, E] f32 each), one slot's
    gate/up/product ([rows, chunk] f32), the accumulator, and the shared
    expert's gate/up/product ([rows, shared width] f32); with expert biases, their
    tables ([experts_local, width] f32) and the weighted down biases ([rows, hidden]);
    with a per-expert norm, the expert's output summed over its slices and
    normed ([rows, hidden] f32 each); per slot, each pick's accumulator."""
    rp = g.rows_padded
    shared = node.op.num_shared_experts and ss.param(f"{node.name}.shared_up").shape[1]
    # gpt-oss: the layer's expert bias tables, read as values, and the down biases' sum.
    biases = 0
    if g.expert_bias:
        biases = g.experts_local * (2 * g.inter_local + g.hidden) + rp * g.hidden
    normed = 2 * rp * g.hidden * g.expert_output_norm
    # per slot: an accumulator per pick, and the weights (the sum's is unused)
    slots = rp * (g.top_k * g.hidden + g.top_k) * g.per_slot
    return 4 * (rp * (5 * g.num_experts + 3 * g.chunk + g.hidden + 3 * (shared or 0)) + biases
                + normed + slots)


def scale_rows(g: MoEGeometry, rows: int) -> int:
    f = formats.get(g.fmt)
    return 1 if f.group_rows == formats.WHOLE else rows // f.group_rows


def buffers(g: MoEGeometry) -> tuple[Need, ...]:
    vmem, smem, dma, i32 = Space.VMEM, Space.SMEM, Space.SEMAPHORE, "int32"
    fetch = f"slice n of the layer's expert fetches in slot n % {g.slots}"
    h, c, k = g.hidden, g.chunk, g.slots
    common = (
        Need("used_v", vmem, (8, g.num_experts), i32, "row 0: experts any valid row picked"),
        Need("used_s", smem, (8, g.num_experts), i32, "the same, as scalars"),
        Need("uniq", smem, (g.experts_local,), i32, "picked local experts, ascending"))
    ids = Need("ids_sem", dma, (1,), "dma_semaphore", "used_v -> used_s")
    if not g.fmt:
        return common + (
            Need("gate_slots", vmem, (k, h, c), g.dtype, fetch),
            Need("up_slots", vmem, (k, h, c), g.dtype, fetch),
            Need("down_slots", vmem, (k, c, h), g.dtype, fetch),
            Need("slot_sems", dma, (3, k), "dma_semaphore", "[gate|up|down, slot]"), ids)
    per = 32 // formats.get(g.fmt).code_bits
    words = f"{fetch}; {g.fmt} codes as 32-bit words"
    scales = f"{fetch}; f32 scales of its {g.fmt} codes"
    return common + (
        Need("gate_slots", vmem, (k, h // per, c), i32, words),
        Need("up_slots", vmem, (k, h // per, c), i32, words),
        Need("down_slots", vmem, (k, c // per, h), i32, words),
        Need("gate_scales", vmem, (k, scale_rows(g, h), c), "float32", scales),
        Need("up_scales", vmem, (k, scale_rows(g, h), c), "float32", scales),
        Need("down_scales", vmem, (k, scale_rows(g, c), h), "float32", scales),
        Need("slot_sems", dma, (6, k), "dma_semaphore",
             "[gate|up|down codes, then their scales, slot]"), ids)
