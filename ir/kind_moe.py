"""Mixture of experts: the ``MoE`` op kind and the card's MoE FFN.

After import: ``MoE`` is registered in ``OP_KINDS`` (kind ``moe``; ir/ops.py
re-exports it), and the card's ``moe`` FFN (its block and size formula) in
``FFNS`` (ir/card.py).
"""

from __future__ import annotations

from typing import ClassVar

from megakernel.ir import limits, sizes
from megakernel.ir.blocks import LayerBuilder
from megakernel.ir.card import FFN, FFNS, ModelConfig
from megakernel.ir.op_base import OP_KINDS, Op, _expect_shapes
from megakernel.ir.op_fields import Activation, Dim, Scoring, _fail
from megakernel.ir.schema import Bool, Float, Int, node
from megakernel.ir.types import DType, ParamSpec


@node
class MoE(Op):
    """Mixture of experts: router, top-k selection, gated expert FFNs, shared experts.

    scores = softmax|sigmoid(x @ router); experts are *selected* by
    scores + correction_bias (when present) but *weighted* by scores; the k weights
    are renormalised to sum 1 when ``renormalize``, then multiplied by
    ``routed_scaling``. ``num_shared_experts`` always-on experts of
    ``shared_intermediate`` each are added (stored as one MLP of their total width);
    with ``shared_expert_gate`` their sum is first multiplied, per token, by
    sigmoid(x . w), w a learned vector of ``hidden`` features (Qwen3-Next).
    gpt-oss's variant: ``router_logit_bias`` adds a learned bias to the router
    logits (selection and weights alike); ``expert_bias`` gives each expert
    biases on gate, up and down; ``swiglu_limit`` L replaces act(g) * u by
    (clip(u, -L, L) + 1) * min(g, L) * sigmoid(swiglu_alpha * min(g, L)).

    Group-limited selection (DeepSeek-V3's ``n_group`` / ``topk_group``): the
    experts form ``n_group`` contiguous groups; each group scores the sum of
    its two best selection scores, only the ``topk_group`` best groups stay
    eligible, and the top k are chosen among their experts. Every tie goes to
    the lowest index (group or expert).
    """

    kind: ClassVar[str] = "moe"
    LIBRARY: ClassVar[str | None] = "moe"
    hidden: Dim
    num_experts: Int(1, limits.MAX_EXPERTS)
    top_k: Int(1, limits.MAX_EXPERTS)
    expert_intermediate: Dim
    scoring: Scoring = Scoring.SOFTMAX
    correction_bias: Bool = False
    renormalize: Bool = False
    routed_scaling: Float(*limits.ROUTED_SCALING, open_low=True) = 1.0
    num_shared_experts: Int(0, limits.MAX_SHARED_EXPERTS) = 0
    shared_intermediate: Int(0, limits.MAX_WIDTH) = 0
    activation: Activation = Activation.SILU
    router_logit_bias: Bool = False
    expert_bias: Bool = False
    swiglu_limit: Float(0.0, limits.MAX_SCALE, open_low=True) | None = None
    swiglu_alpha: Float(0.0, limits.MAX_SCALE, open_low=True) = 1.0
    n_group: Int(1, limits.MAX_EXPERTS) = 1
    topk_group: Int(1, limits.MAX_EXPERTS) = 1
    shared_expert_gate: Bool = False

    def __post_init__(self):
        if self.shared_expert_gate and not self.num_shared_experts:
            raise _fail("shared_expert_gate", "shared_expert_gate=True with "
                        "num_shared_experts=0: there is no shared expert to gate")
        if self.top_k > self.num_experts:
            raise _fail("top_k", f"top_k={self.top_k} exceeds num_experts={self.num_experts}")
        if self.n_group > 1:
            per = self.num_experts // self.n_group
            if self.num_experts % self.n_group or per < 2:
                raise _fail("n_group", f"n_group={self.n_group} must split num_experts="
                            f"{self.num_experts} into equal groups of at least 2 experts")
            if self.topk_group > self.n_group:
                raise _fail("topk_group", f"topk_group={self.topk_group} exceeds n_group="
                            f"{self.n_group}")
            if self.top_k > self.topk_group * per:
                raise _fail("top_k", f"top_k={self.top_k} exceeds the {self.topk_group * per} "
                            f"experts of topk_group={self.topk_group} groups of {per}")
        elif self.topk_group != 1:
            raise _fail("topk_group", f"topk_group={self.topk_group} needs n_group > 1")
        if self.num_shared_experts and not self.shared_intermediate:
            raise _fail("shared_intermediate", f"shared_intermediate=0 with "
                        f"num_shared_experts={self.num_shared_experts}: expected >= 1")
        if self.swiglu_limit is not None and self.activation != Activation.SILU:
            raise _fail("swiglu_limit", f"swiglu_limit={self.swiglu_limit} needs activation="
                        f"'silu', found {self.activation.value!r}")
        if self.swiglu_limit is None and self.swiglu_alpha != 1.0:
            raise _fail("swiglu_alpha", f"swiglu_alpha={self.swiglu_alpha} is only used "
                        "with swiglu_limit (the clamped SwiGLU); set both or neither")

    @property
    def shared_width(self) -> int:
        return self.num_shared_experts * self.shared_intermediate

    def params(self, dtype):
        h, e, i = self.hidden, self.num_experts, self.expert_intermediate
        p = {"router": ParamSpec((h, e), dtype)}
        if self.correction_bias:
            p["router_bias"] = ParamSpec((e,), DType.F32)
        if self.router_logit_bias:
            p["router_logit_bias"] = ParamSpec((e,), dtype)
        p.update(experts_gate=ParamSpec((e, h, i), dtype),
                 experts_up=ParamSpec((e, h, i), dtype),
                 experts_down=ParamSpec((e, i, h), dtype))
        if self.expert_bias:
            p.update(experts_gate_bias=ParamSpec((e, i), dtype),
                     experts_up_bias=ParamSpec((e, i), dtype),
                     experts_down_bias=ParamSpec((e, h), dtype))
        if self.num_shared_experts:
            s = self.shared_width
            p.update(shared_gate=ParamSpec((h, s), dtype), shared_up=ParamSpec((h, s), dtype),
                     shared_down=ParamSpec((s, h), dtype))
        if self.shared_expert_gate:
            p["shared_expert_gate"] = ParamSpec((h,), dtype)
        return p

    def infer(self, inputs):
        _expect_shapes(self, inputs, ((self.hidden,),))
        return ((self.hidden,),)


OP_KINDS.register(MoE.kind)(MoE)


def _moe_block(c: ModelConfig, b: LayerBuilder, hn: str) -> str:
    """The card's MoE FFN: one MoE op of the card's moe block."""
    m = c.moe
    return b.add("moe", lambda: MoE(c.hidden_size, m.num_experts, m.top_k,
                                    m.expert_intermediate, m.scoring, m.correction_bias,
                                    m.renormalize, m.routed_scaling, m.num_shared_experts,
                                    m.shared_intermediate, c.activation, m.router_logit_bias,
                                    m.expert_bias, m.swiglu_limit, m.swiglu_alpha,
                                    n_group=m.n_group, topk_group=m.topk_group,
                                    shared_expert_gate=m.shared_expert_gate), (hn,), "ffn_out")


def _moe_sizes(c: ModelConfig) -> int:
    """Routed experts (router, gate/up/down, biases), shared experts and their
    gate; the router's correction bias is kept in float32 (MoE.params)."""
    m, h, item = c.moe, c.hidden_size, sizes.item_size(c)
    i = m.expert_intermediate
    routed = m.num_experts * (h + 3 * h * i + m.router_logit_bias + (2 * i + h) * m.expert_bias)
    shared = 3 * h * m.num_shared_experts * m.shared_intermediate + h * m.shared_expert_gate
    return (routed + shared) * item + 4 * m.num_experts * m.correction_bias


FFNS.register("moe")(FFN(_moe_block, _moe_sizes))
