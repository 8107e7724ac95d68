"""The model card: a flat record of the few numbers that define a model, and the
builder that turns it into the layer graph.

A card reads like a published config (MaxText keeps a model in ~20 flat keys);
``build`` makes the graph with one template per layer kind, no if-ladders over
model families. Identical layers come out equal, so the graph groups them into
stacks by itself.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import ClassVar

import numpy as np

from megakernel.errors import IRError, error_context
from megakernel.ir import limits, sizes
from megakernel.ir.graph import Layer, Model, OpNode
from megakernel.ir.kind_elementwise import Scale, Softcap
from megakernel.ir.kind_norm_parts import MeanSquare, RMSScale
from megakernel.ir.ops import MLP, Add, Attention, Linear, MoE, Op, RMSNorm, Rope, RopeScaling
from megakernel.ir.schema import AnyFloat, Bool, Int, ModelName, Word, json_kind, node
from megakernel.ir.types import DType, TensorSpec
from megakernel.registry import Registry

# Card fields carry exact types and bounded sizes, so that the size arithmetic
# (ir/sizes.py) can run before anything is built. Floats, head_dim,
# sliding_window and the words are range-checked by the op they are copied into,
# whose error names the layer (``layers.0.attention: softmax_scale: ...``).
_Width = Int(1, limits.MAX_WIDTH)
_Heads = Int(1, limits.MAX_HEADS)


@node
class MoEConfig:
    num_experts: Int(1, limits.MAX_EXPERTS)
    top_k: Int(1, limits.MAX_EXPERTS)
    expert_intermediate: _Width
    scoring: Word = "softmax"
    correction_bias: Bool = False
    renormalize: Bool = True
    routed_scaling: AnyFloat = 1.0
    num_shared_experts: Int(0, limits.MAX_SHARED_EXPERTS) = 0
    shared_intermediate: Int(0, limits.MAX_WIDTH) = 0
    # gpt-oss: biased router logits, biased experts, clamped SwiGLU (ir/ops.py MoE).
    router_logit_bias: Bool = False
    expert_bias: Bool = False
    swiglu_limit: AnyFloat | None = None
    swiglu_alpha: AnyFloat = 1.0


@node
class ModelConfig:
    """Flat description of a decoder-only transformer (see docs/ir.md; every
    range in docs/validation.md)."""

    ERROR_PATH: ClassVar[str] = "config"

    name: ModelName
    vocab_size: Int(1, limits.MAX_VOCAB)
    hidden_size: _Width
    num_layers: Int(1, limits.MAX_LAYERS)
    num_q_heads: _Heads
    num_kv_heads: _Heads
    head_dim: Int(0, limits.MAX_HEAD_DIM)
    intermediate_size: _Width
    activation: Word = "silu"
    norm_eps: AnyFloat = 1e-6
    norm_offset: Bool = False
    rope_theta: AnyFloat = 10000.0
    rotary_dim: Int(0, limits.MAX_HEAD_DIM) = 0
    rope_scaling: RopeScaling | None = None
    qkv_bias: Bool = False
    o_bias: Bool = False
    qk_norm: Bool = False
    sliding_window: Int(0, limits.MAX_SEQ_LEN) | None = None
    softmax_scale: AnyFloat = 0.0
    tie_embeddings: Bool = False
    dtype: Word = "bfloat16"
    max_seq_len: Int(1, limits.MAX_SEQ_LEN) = 4096
    moe: MoEConfig | None = None
    first_k_dense: Int(0, limits.MAX_LAYERS) = 0
    # Per layer, its mixer's name in MIXERS (Hugging Face 5.x ``layer_types``);
    # absent: every layer full attention (windowed by ``sliding_window`` if set).
    layer_types: tuple[Word, ...] | None = None
    # Gemma 2's final-logit soft-capping: logits -> cap * tanh(logits / cap).
    final_logit_softcap: AnyFloat | None = None
    # Where each block's norms sit: ``pre_norms`` before attention and before
    # the FFN (Llama); ``post_norms`` on the attention output and on the FFN
    # output, before each residual add (both: Gemma 2/3; post only: OLMo 2).
    pre_norms: Bool = True
    post_norms: Bool = False
    # Gemma: embedded tokens times sqrt(hidden_size), rounded to ``dtype``.
    scale_embeddings: Bool = False
    # Gemma 2: attention scores soft-capped, cap * tanh(scores / cap).
    attn_logit_softcap: AnyFloat | None = None
    # gpt-oss: a learned per-head logit in every softmax denominator.
    attention_sinks: Bool = False
    # Gemma 3: RoPE base of the sliding_attention layers (unscaled); the
    # others use rope_theta and rope_scaling. None: all layers alike.
    sliding_rope_theta: AnyFloat | None = None
    # OLMo 2: q_norm / k_norm over the whole projection, all heads together.
    qk_norm_all_heads: Bool = False

    def __post_init__(self):
        if self.moe is None and self.first_k_dense:
            raise IRError("first_k_dense is set but the model has no moe block",
                          path="first_k_dense", hint="remove first_k_dense or add a moe block")
        if self.moe is not None and self.first_k_dense >= self.num_layers:
            raise IRError(f"first_k_dense={self.first_k_dense} leaves no MoE layer among "
                          f"num_layers={self.num_layers}", path="first_k_dense",
                          hint=f"use a value below {self.num_layers}, or remove the moe block")
        DType.parse(self.dtype, path="dtype")
        if self.layer_types is not None:
            if len(self.layer_types) != self.num_layers:
                raise IRError(f"lists {len(self.layer_types)} layers, expected num_layers="
                              f"{self.num_layers}", path="layer_types")
            unknown = sorted({t for t in self.layer_types if t not in MIXERS})
            if unknown:
                raise IRError(f"{unknown} are not mixers; known: {sorted(MIXERS.kinds())}",
                              path="layer_types")
            # `is None`: a 0 is a value, refused by the attention op that reads it.
            if "sliding_attention" in self.layer_types and self.sliding_window is None:
                raise IRError("names sliding_attention layers but sliding_window is not set",
                              path="layer_types", hint="set sliding_window")
        if self.sliding_rope_theta is not None and "sliding_attention" not in (
                self.layer_types or ()):
            raise IRError("sliding_rope_theta is set but layer_types names no "
                          "sliding_attention layer", path="sliding_rope_theta",
                          hint="list the sliding layers in layer_types, or remove it")
        if self.qk_norm_all_heads and not self.qk_norm:
            raise IRError("qk_norm_all_heads is set but qk_norm is not", path="qk_norm_all_heads",
                          hint="set qk_norm, or remove qk_norm_all_heads")

    def layer_kind(self, index: int) -> str:
        """The FFN of layer ``index``: its name in FFNS."""
        return "moe" if self.moe is not None and index >= self.first_k_dense else "dense"

    def mixer(self, index: int) -> str:
        """The mixer of layer ``index``: its name in MIXERS."""
        return "full_attention" if self.layer_types is None else self.layer_types[index]

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "ModelConfig":
        """The card of ``data``; every unknown, missing or mistyped field is named."""
        if not isinstance(data, dict):
            raise IRError(f"expected an object, found {json_kind(data)}", path="config")
        return cls(**data)


# Op fields whose card field has another name: an op's error says which card
# field to change (``layers.0.q_rope: theta: ... (set by the card's rope_theta)``).
_CARD_FIELDS = {"eps": "norm_eps", "offset": "norm_offset",
                "theta": "rope_theta or sliding_rope_theta", "logit_softcap": "attn_logit_softcap",
                "scaling": "rope_scaling", "bias": "qkv_bias or o_bias",
                "hidden": "hidden_size", "intermediate": "intermediate_size",
                "dim": "hidden_size or head_dim", "num_heads": "num_q_heads or num_kv_heads",
                "in_features": "hidden_size or num_q_heads x head_dim",
                "out_features": "hidden_size or the head counts x head_dim"}


def _with_card_field(err: IRError) -> IRError:
    field = err.message.split(":", 1)[0]
    if field not in _CARD_FIELDS:
        return err
    hint = f"set by the card's {_CARD_FIELDS[field]}" + (f"; {err.hint}" if err.hint else "")
    return type(err)(err.message, path=err.path, hint=hint)


class LayerBuilder:
    """Appends ops and their output tensors in execution order; ``layer()``
    makes the verified Layer. Cards use it, and so can a hand-written graph
    (docs/new-model.md)."""

    def __init__(self, hidden: int):
        self.nodes: list[OpNode] = []
        self.tensors: dict[str, TensorSpec] = {"x": TensorSpec("x", (hidden,))}

    def add(self, name: str, make_op, inputs: tuple[str, ...], output: str) -> str:
        with error_context(name):
            try:
                op: Op = make_op()
            except IRError as err:
                raise _with_card_field(err) from None
            (shape,) = op.infer(tuple(self.tensors[t].shape for t in inputs))
        self.nodes.append(OpNode(name, op, inputs, (output,)))
        self.tensors[output] = TensorSpec(output, shape)
        return output

    def layer(self, kind: str, output: str) -> Layer:
        return Layer(kind, tuple(self.nodes), tuple(self.tensors.values()), "x", output)


def _norm(c: ModelConfig, dim: int):
    return lambda: RMSNorm(dim, c.norm_eps, c.norm_offset)


def _qk_norm(c: ModelConfig, b: LayerBuilder, t: str, which: str) -> str:
    """Per-head norm, or (``qk_norm_all_heads``) one over the whole projection,
    in two parts so that its mean of squares can be summed over cores."""
    if not c.qk_norm_all_heads:
        return b.add(f"{which}_norm", _norm(c, c.head_dim), (t,), f"{which}_normed")
    width = b.tensors[t].shape[0]
    ms = b.add(f"{which}_ms", lambda: MeanSquare(width), (t,), f"{which}_ms")
    return b.add(f"{which}_norm", lambda: RMSScale(width, c.norm_eps, c.norm_offset), (t, ms),
                 f"{which}_normed")


def _attention_block(c: ModelConfig, b: LayerBuilder, x: str, window, local: bool) -> str:
    h, d = c.hidden_size, c.head_dim
    q_dim, kv_dim = c.num_q_heads * d, c.num_kv_heads * d
    theta, scaling = c.rope_theta, c.rope_scaling
    if local and c.sliding_rope_theta is not None:
        theta, scaling = c.sliding_rope_theta, None
    rope = lambda heads: lambda: Rope(heads, d, theta, c.rotary_dim, scaling)  # noqa: E731

    hn = b.add("input_norm", _norm(c, h), (x,), "h_attn") if c.pre_norms else x
    q = b.add("q_proj", lambda: Linear(h, q_dim, c.qkv_bias), (hn,), "q")
    k = b.add("k_proj", lambda: Linear(h, kv_dim, c.qkv_bias), (hn,), "k")
    v = b.add("v_proj", lambda: Linear(h, kv_dim, c.qkv_bias), (hn,), "v")
    if c.qk_norm:
        q, k = _qk_norm(c, b, q, "q"), _qk_norm(c, b, k, "k")
    q = b.add("q_rope", rope(c.num_q_heads), (q,), "q_rot")
    k = b.add("k_rope", rope(c.num_kv_heads), (k,), "k_rot")
    o = b.add("attention", lambda: Attention(c.num_q_heads, c.num_kv_heads, d,
                                             c.softmax_scale, window, c.attn_logit_softcap,
                                             c.attention_sinks),
              (q, k, v), "attn")
    o = b.add("o_proj", lambda: Linear(q_dim, h, c.o_bias), (o,), "attn_out")
    if c.post_norms:
        o = b.add("post_attn_norm", _norm(c, h), (o,), "attn_normed")
    return b.add("attn_residual", Add, (x, o), "x_mid")


# The mixer table: a layer_types name -> (layer kind label, block builder
# (card, builder, residual tensor) -> the residual after the mixer).
MIXERS: Registry = Registry("mixer", "ir/config.py", per_op_kind=False)
MIXERS.register("full_attention")(
    ("", lambda c, b, x: _attention_block(c, b, x, c.sliding_window if c.layer_types is None
                                          else None, False)))
MIXERS.register("sliding_attention")(
    ("sliding", lambda c, b, x: _attention_block(c, b, x, c.sliding_window, True)))


def _mlp(c: ModelConfig, b: LayerBuilder, hn: str) -> str:
    return b.add("mlp", lambda: MLP(c.hidden_size, c.intermediate_size, c.activation), (hn,),
                 "ffn_out")


def _moe(c: ModelConfig, b: LayerBuilder, hn: str) -> str:
    m = c.moe
    return b.add("moe", lambda: MoE(c.hidden_size, m.num_experts, m.top_k,
                                    m.expert_intermediate, m.scoring, m.correction_bias,
                                    m.renormalize, m.routed_scaling, m.num_shared_experts,
                                    m.shared_intermediate, c.activation, m.router_logit_bias,
                                    m.expert_bias, m.swiglu_limit, m.swiglu_alpha),
                 (hn,), "ffn_out")


# The FFN table: a layer kind -> block builder (card, builder, normed input) -> output.
FFNS: Registry = Registry("ffn", "ir/config.py", per_op_kind=False)
FFNS.register("dense")(_mlp)
FFNS.register("moe")(_moe)


def _ffn_block(c: ModelConfig, b: LayerBuilder, x: str, kind: str) -> str:
    # "post_norm" is the norm after the attention block, before the FFN (HF's
    # post_attention_layernorm in Llama); the FFN output's own is post_ffn_norm.
    hn = b.add("post_norm", _norm(c, c.hidden_size), (x,), "h_ffn") if c.pre_norms else x
    f = FFNS(kind, "ffn")(c, b, hn)
    if c.post_norms:
        f = b.add("post_ffn_norm", _norm(c, c.hidden_size), (f,), "ffn_normed")
    return b.add("ffn_residual", Add, (x, f), "y")


@functools.lru_cache(maxsize=64)
def _layer(c: ModelConfig, mixer: str, ffn: str) -> Layer:
    label, block = MIXERS(mixer, "mixer")
    b = LayerBuilder(c.hidden_size)
    x = block(c, b, "x")
    return b.layer(f"{label}_{ffn}" if label else ffn, _ffn_block(c, b, x, ffn))


def build(config: ModelConfig) -> Model:
    """The layer graph of ``config``; errors name ``layers.{i}.{op}.{field}``.
    A card whose weights and KV caches cannot fit the largest supported
    topology is refused first, from its numbers alone (ir/sizes.py)."""
    sizes.check_fits(sizes.of_config(config), path="config")
    layers = []
    for i in range(config.num_layers):
        with error_context(f"layers.{i}"):
            layers.append(_layer(config, config.mixer(i), config.layer_kind(i)))
    with error_context("final_norm"):
        try:
            final_norm = RMSNorm(config.hidden_size, config.norm_eps, config.norm_offset)
        except IRError as err:
            raise _with_card_field(err) from None
    logit_ops = ()
    if config.final_logit_softcap is not None:
        with error_context("final_logit_softcap"):
            logit_ops = (Softcap(config.final_logit_softcap),)
    dtype = DType.parse(config.dtype)
    embed_ops = ()
    if config.scale_embeddings:
        # Gemma casts sqrt(hidden) to the weight dtype first: 59.87 -> 59.75 in bf16.
        factor = float(np.asarray(math.sqrt(config.hidden_size), dtype.np))
        embed_ops = (Scale(factor),)
    return Model(config.name, config.vocab_size, config.hidden_size, tuple(layers),
                 final_norm, config.tie_embeddings, dtype, config.max_seq_len, logit_ops,
                 embed_ops)
