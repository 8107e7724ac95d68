"""Mixture of experts: the ``MoE`` op kind and the card's MoE FFN.

After import: ``MoE`` is in ``OP_KINDS`` (kind ``moe``; ir/ops.py re-exports
it), the card's ``moe`` FFN (its block, size formula) in ``FFNS`` (ir/card.py).

The card's MoE FFN. Plain (no ``latent_size``, no ``expert_output_norm``):
one ``MoE`` op on the normed input hn [H], its shared experts inside it.
Otherwise the routed experts and everything around them are nodes of their own:

    hn [H] -> pre_expert_proj (linear H -> L) [-> pre_expert_norm (rmsnorm L)]
           -> moe (MoE at hidden L; router_dim H: its router reads hn; with
              expert_output_norm 'per_expert' per_slot: slots and weights)
          [-> expert_combine (expert_combine: 'per_expert' norm, weights, sum)]
          [-> expert_output_norm (rmsnorm L: 'weighted_sum')]
           -> post_expert_proj (linear L -> H)
          [+ shared_experts (mlp H -> S -> H on hn), shared_add]

with L = latent_size (no projections when 0, L = H). Why the shared experts
are an ``mlp`` node here, not inside the op: Kimi K3's read the full-width hn
and are added after post_expert_proj, while the op works at L; and as a node
their sharding, stream and emitter are the dense MLP's, unchanged. Why the
weighted sum's norm is an ``rmsnorm`` node, not part of the op: split over
cores (experts, or each expert's width) the op's output is a partial sum, and
the norm must read the whole sum; as the next node it does, after the
all-reduce the sharding rules put there for any norm of a partial sum
(compiler/shard_rules.py). Likewise the per-expert norm: the op emits the picks
apart (``per_slot``), the combine node norms them after their all-reduce.
"""

from __future__ import annotations

from typing import ClassVar

from megakernel.ir import limits, sizes
from megakernel.ir.blocks import LayerBuilder, norm
from megakernel.ir.card import FFN, FFNS, ModelConfig
from megakernel.ir.kind_expert_combine import ExpertCombine
from megakernel.ir.kind_mlp import MLP
from megakernel.ir.kind_rmsnorm import RMSNorm
from megakernel.ir.op_base import OP_KINDS, Add, Linear, Op, _expect_shapes
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

    Muse Spark's router: logits = (r @ router) * ``router_logit_scale``
    (+ router_logit_bias), with ``router_f32`` an f32 router weight applied to
    the unrounded f32 input; renormalised weights are divided by (their sum +
    ``renormalize_eps``).

    The latent MoE (the card block below builds it): with ``router_dim`` > 0 the op
    takes two inputs, the experts' x [hidden] (the latent input) and the
    router's r [router_dim] (the full-width FFN input); 0: one input, r = x.
    Its shared experts, which read the full width, are then an MLP node beside
    it, so such an op has none. ``expert_output_norm``: each expert's output
    y_k [hidden] is normalised before it is weighted (Muse Spark's
    post_expert_norm), y_k <- rms(y_k) * s, or with
    ``expert_output_norm_input_scaled`` y_k <- rms(round(y_k * s)) (rounded to
    the model dtype), s = 1 + w with ``expert_output_norm_offset``, else w.
    In the op it needs each expert whole on a core; the card builds instead
    ``per_slot``: each row's k picks unweighted, [top_k x hidden] (slot j: its
    j-th picked expert by ascending id), and their weights [top_k], for an
    ``expert_combine`` node (ir/kind_expert_combine.py) to norm and sum after
    the slots' all-reduce, so experts split any way. A norm of the weighted
    sum (Kimi K3) is an rmsnorm node after the op.
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
    router_dim: Int(0, limits.MAX_WIDTH) = 0
    router_logit_scale: Float(0.0, limits.MAX_SCALE, open_low=True) = 1.0
    router_f32: Bool = False
    renormalize_eps: Float(*limits.RENORMALIZE_EPS) = 0.0
    expert_output_norm: Bool = False
    expert_output_norm_eps: Float(*limits.NORM_EPS) = 1e-6
    expert_output_norm_input_scaled: Bool = False
    expert_output_norm_offset: Bool = False
    per_slot: Bool = False

    def __post_init__(self):
        self._check_latent()
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
        _check_shared(self.num_shared_experts, self.shared_intermediate)
        if self.swiglu_limit is not None and self.activation != Activation.SILU:
            raise _fail("swiglu_limit", f"swiglu_limit={self.swiglu_limit} needs activation="
                        f"'silu', found {self.activation.value!r}")
        if self.swiglu_limit is None and self.swiglu_alpha != 1.0:
            raise _fail("swiglu_alpha", f"swiglu_alpha={self.swiglu_alpha} is only used "
                        "with swiglu_limit (the clamped SwiGLU); set both or neither")

    def _check_latent(self):
        if self.router_dim and self.num_shared_experts:
            raise _fail("num_shared_experts", f"num_shared_experts={self.num_shared_experts} "
                        f"with router_dim={self.router_dim}: a latent MoE's shared experts "
                        "read the full-width input, as an mlp node beside this op")
        if self.renormalize_eps and not self.renormalize:
            raise _fail("renormalize_eps", f"renormalize_eps={self.renormalize_eps} with "
                        "renormalize=False: the weights are not renormalised")
        if self.per_slot and (self.expert_output_norm or self.num_shared_experts):
            raise _fail("per_slot", "per_slot=True (picks apart, for expert_combine) expects "
                        f"expert_output_norm=False, num_shared_experts=0; found "
                        f"{self.expert_output_norm}, {self.num_shared_experts}")
        if self.expert_output_norm_input_scaled and not self.expert_output_norm:
            raise _fail("expert_output_norm_input_scaled", "expert_output_norm_input_scaled="
                        "True with expert_output_norm=False: there is no norm to scale")

    @property
    def shared_width(self) -> int:
        return self.num_shared_experts * self.shared_intermediate

    @property
    def router_width(self) -> int:
        """Features of the router's input: ``router_dim``, or ``hidden`` when 0."""
        return self.router_dim or self.hidden

    @property
    def whole_experts(self) -> bool:
        """Whether each expert's output must be whole on one core (its
        intermediate not split): a per-expert norm reads all of it."""
        return self.expert_output_norm

    def params(self, dtype):
        h, e, i = self.hidden, self.num_experts, self.expert_intermediate
        p = {"router": ParamSpec((self.router_width, e), DType.F32 if self.router_f32 else dtype)}
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
        if self.expert_output_norm:
            p["expert_output_norm"] = ParamSpec((h,), dtype)
        return p

    def infer(self, inputs):
        router = ((self.router_dim,),) if self.router_dim else ()
        _expect_shapes(self, inputs, ((self.hidden,),) + router)
        if self.per_slot:       # each pick's output, and its weight (the module docstring)
            return ((self.top_k * self.hidden,), (self.top_k,))
        return ((self.hidden,),)


def _check_shared(count: int, width: int) -> None:
    if count and not width:
        raise _fail("shared_intermediate", f"shared_intermediate=0 with "
                    f"num_shared_experts={count}: expected >= 1")


OP_KINDS.register(MoE.kind)(MoE)


def _moe_op(c: ModelConfig, width: int, router_dim: int, shared: bool) -> MoE:
    """The card's MoE op at ``width`` features (its router on ``router_dim``,
    0: the same input), with its shared experts inside when ``shared``."""
    m = c.moe
    # the shared experts' width is the op's to check, wherever they are built
    _check_shared(m.num_shared_experts, m.shared_intermediate)
    return MoE(width, m.num_experts, m.top_k, m.expert_intermediate, m.scoring,
               m.correction_bias, m.renormalize, m.routed_scaling,
               m.num_shared_experts if shared else 0, m.shared_intermediate if shared else 0,
               c.activation, m.router_logit_bias, m.expert_bias, m.swiglu_limit,
               m.swiglu_alpha, n_group=m.n_group, topk_group=m.topk_group,
               shared_expert_gate=m.shared_expert_gate, router_dim=router_dim,
               router_logit_scale=m.router_logit_scale, router_f32=m.router_f32,
               renormalize_eps=m.renormalize_eps,
               per_slot=m.expert_output_norm == "per_expert")


def _norm_eps(c: ModelConfig) -> float:
    m = c.moe
    return c.norm_eps if m.expert_output_norm_eps is None else m.expert_output_norm_eps


def _split(c: ModelConfig) -> bool:
    """Whether the routed experts' output goes through nodes of its own
    before the shared experts join it (latent projections, a norm)."""
    return bool(c.moe.latent_size) or c.moe.expert_output_norm != "none"


def _moe_block(c: ModelConfig, b: LayerBuilder, hn: str) -> str:
    """The card's MoE FFN of the normed input ``hn``: its output tensor."""
    m, h = c.moe, c.hidden_size
    if not _split(c):
        return b.add("moe", lambda: _moe_op(c, h, 0, True), (hn,), "ffn_out")
    width, x, inputs = m.latent_size or h, hn, (hn,)
    if m.latent_size:
        # both projections read whole tensors: split by rows (Linear.split_rows)
        x = b.add("pre_expert_proj", lambda: Linear(h, width, split_rows=True), (hn,), "x_latent")
        if m.latent_input_norm:
            x = b.add("pre_expert_norm", norm(c, width), (x,), "x_latent_normed")
        inputs = (x, hn)
    moe_op = lambda: _moe_op(c, width, h if m.latent_size else 0, False)  # noqa: E731
    if m.expert_output_norm == "per_expert":
        slots, weights = b.add("moe", moe_op, inputs, ("slots", "slot_weights"))
        routed = b.add("expert_combine", lambda: ExpertCombine(
            width, m.top_k, True, _norm_eps(c), m.expert_output_norm_input_scaled,
            c.norm_offset), (slots, weights), "routed")
    else:
        routed = b.add("moe", moe_op, inputs, "routed")
    if m.expert_output_norm == "weighted_sum":
        routed = b.add("expert_output_norm",
                       lambda: RMSNorm(width, _norm_eps(c), c.norm_offset), (routed,),
                       "routed_normed")
    out = "routed_out" if m.num_shared_experts else "ffn_out"
    if m.latent_size:
        post = lambda: Linear(width, h, split_rows=True)  # noqa: E731
        routed = b.add("post_expert_proj", post, (routed,), out)
    if not m.num_shared_experts:
        return routed
    shared = b.add("shared_experts", lambda: MLP(h, m.num_shared_experts * m.shared_intermediate,
                                                 c.activation), (hn,), "shared")
    return b.add("shared_add", Add, (routed, shared), "ffn_out")


def _moe_sizes(c: ModelConfig) -> int:
    """Weight bytes of one MoE FFN: the router (f32 with ``router_f32``; its
    correction bias always f32, MoE.params), the routed experts at their
    width and their biases, the shared experts and their gate, and the
    latent projections and norms."""
    m, h, item = c.moe, c.hidden_size, sizes.item_size(c)
    w, i = m.latent_size or h, m.expert_intermediate
    router = h * m.num_experts * (4 if m.router_f32 else item)
    routed = m.num_experts * (3 * w * i + m.router_logit_bias + (2 * i + w) * m.expert_bias)
    shared = 3 * h * m.num_shared_experts * m.shared_intermediate + h * m.shared_expert_gate
    latent = (2 * h * w + w * m.latent_input_norm) if m.latent_size else 0
    norms = w * (m.expert_output_norm != "none")
    bias = 4 * m.num_experts * m.correction_bias
    return (routed + shared + latent + norms) * item + router + bias


FFNS.register("moe")(FFN(_moe_block, _moe_sizes))
