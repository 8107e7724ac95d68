"""The model card: a flat record of the few numbers that define a model.

A card reads like a published config (MaxText keeps a model in ~20 flat keys);
``ir/config.py`` ``build`` turns it into the layer graph, layer by layer
(``ir/blocks.py``). The card's per-layer choices are names in two tables declared
here, ``MIXERS`` (a ``layer_types`` entry) and ``FFNS`` (``layer_kind``), whose
records each op kind's ``ir/kind_*.py`` registers (attention, mlp, moe, mla,
gdn); importing ``megakernel.ir`` imports them all.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import ClassVar, NamedTuple

from megakernel.errors import IRError, shown
from megakernel.ir import limits
from megakernel.ir.rope_scaling import RopeScaling
from megakernel.ir.schema import AnyFloat, Bool, Int, ModelName, Word, json_kind, node
from megakernel.ir.types import DType
from megakernel.ir.weight_kinds import Quantize
from megakernel.registry import Registry

# The format tag of a card file (models/cards.py reads and writes them).
CARD_FORMAT = "megakernel.card/1"


class Mixer(NamedTuple):
    """A card mixer: the label of its layers' kind, its block builder (card,
    LayerBuilder, residual tensor) -> the residual after the mixer, and its
    sizes (card) -> (weight bytes, state bytes of one sequence) of one layer's
    mixer, its block norms included (ir/sizes.py adds them up). ``rotary``:
    its block rotates q and k with the card's RoPE unless the card's
    ``nope_layer_types`` names it."""

    label: str
    block: Callable
    sizes: Callable
    rotary: bool = False


class FFN(NamedTuple):
    """A card FFN: its block builder (card, LayerBuilder, normed input) ->
    output, and its sizes (card) -> weight bytes of one layer's FFN."""

    block: Callable
    sizes: Callable


# The mixer table: a layer_types name -> its Mixer, registered by the kind
# module of its op (full and sliding attention: ir/kind_attention.py).
MIXERS: Registry = Registry("block", "its op kind's ir/kind_*.py", per_op_kind=False,
                            keyed_by="mixer")
# The FFN table: a layer kind -> its FFN (dense: ir/kind_mlp.py, moe: ir/kind_moe.py).
FFNS: Registry = Registry("block", "its op kind's ir/kind_*.py", per_op_kind=False,
                          keyed_by="ffn")

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
    # Qwen3-Next: the shared experts' sum is scaled per token by sigmoid(x . w).
    shared_expert_gate: Bool = False
    # gpt-oss: biased router logits, biased experts, clamped SwiGLU (ir/kind_moe.py MoE).
    router_logit_bias: Bool = False
    expert_bias: Bool = False
    swiglu_limit: AnyFloat | None = None
    swiglu_alpha: AnyFloat = 1.0
    # DeepSeek's group-limited routing (MoE op): 1 / 1 is plain top-k.
    n_group: Int(1, limits.MAX_EXPERTS) = 1
    topk_group: Int(1, limits.MAX_EXPERTS) = 1
    # The latent MoE (Muse Spark, Kimi K3; ir/kind_moe.py): experts at
    # latent_size features between pre_expert_proj and post_expert_proj, the
    # router on the full-width input; 0: no latent projections.
    latent_size: Int(0, limits.MAX_WIDTH) = 0
    # Muse Spark: the card's block norm (norm_eps, norm_offset) on the latent input.
    latent_input_norm: Bool = False
    # "per_expert": each expert's output normalised before weighting (Muse
    # Spark's post_expert_norm); "weighted_sum": the weighted sum of the routed
    # experts, before post_expert_proj and the shared experts (Kimi K3).
    expert_output_norm: Word = "none"
    expert_output_norm_eps: AnyFloat | None = None      # None: norm_eps
    # Muse Spark: x * (1 + w) rounded to dtype, then a parameter-free RMS;
    # False: rms(x) * w, (1 + w) with norm_offset, as the block norms.
    expert_output_norm_input_scaled: Bool = False
    # Muse Spark's router: f32 logits x @ W_r of an f32 weight, times a scale,
    # and the top-k weights divided by (their sum + renormalize_eps).
    router_logit_scale: AnyFloat = 1.0
    renormalize_eps: AnyFloat = 0.0
    router_f32: Bool = False

    def __post_init__(self):
        norms = ("none", "per_expert", "weighted_sum")
        if self.expert_output_norm not in norms:
            raise IRError(f"expert_output_norm={shown(self.expert_output_norm)}, expected one "
                          f"of {list(norms)}", path="expert_output_norm",
                          hint="per_expert normalises each expert's output (Muse Spark), "
                          "weighted_sum their weighted sum (Kimi K3)")
        unnormed = self.expert_output_norm == "none"
        for name, given in (("expert_output_norm_eps", self.expert_output_norm_eps is not None),
                            ("expert_output_norm_input_scaled",
                             self.expert_output_norm_input_scaled)):
            if unnormed and given:
                raise IRError(f"{name}={shown(getattr(self, name))} with expert_output_norm="
                              "'none': there is no expert output norm", path=name,
                              hint=f"set expert_output_norm, or remove {name}")
        if self.expert_output_norm_input_scaled and self.expert_output_norm == "weighted_sum":
            raise IRError("expert_output_norm_input_scaled=true with expert_output_norm="
                          "'weighted_sum': the input-scaled form is built for per_expert only",
                          path="expert_output_norm_input_scaled",
                          hint="use expert_output_norm='per_expert', or the plain norm "
                          "(expert_output_norm_input_scaled=false)")
        if self.latent_input_norm and not self.latent_size:
            raise IRError("latent_input_norm=true with latent_size=0: there is no latent "
                          "input to normalise", path="latent_input_norm",
                          hint="set latent_size, or remove latent_input_norm")
        if self.shared_expert_gate and (self.latent_size or not unnormed):
            raise IRError("shared_expert_gate=true with a latent MoE or an expert output "
                          f"norm (latent_size={self.latent_size}, expert_output_norm="
                          f"{shown(self.expert_output_norm)}): their shared experts are an "
                          "ungated MLP beside the routed ones", path="shared_expert_gate",
                          hint="remove shared_expert_gate, or latent_size and "
                          "expert_output_norm")
        if self.renormalize_eps and not self.renormalize:
            raise IRError(f"renormalize_eps={self.renormalize_eps} with renormalize=false: "
                          "the top-k weights are not renormalised", path="renormalize_eps",
                          hint="set renormalize=true, or remove renormalize_eps")


@node
class MLAConfig:
    """Multi-head latent attention (DeepSeek-V3, Kimi; ir/kind_mla.py), in
    Hugging Face's names. ``q_lora_rank`` 0: one q projection instead of
    q_a -> norm -> q_b. ``rope`` false: Kimi's NoPE (the rope part is split
    off but not rotated). ``latent_norm_eps``: the q_a and kv_a norms' eps
    (Hugging Face builds them with 1e-6 whatever rms_norm_eps says)."""

    kv_lora_rank: _Width
    qk_nope_head_dim: Int(1, limits.MAX_HEAD_DIM)
    qk_rope_head_dim: Int(1, limits.MAX_HEAD_DIM)
    v_head_dim: Int(1, limits.MAX_HEAD_DIM)
    q_lora_rank: Int(0, limits.MAX_WIDTH) = 0
    rope: Bool = True
    output_gate: Bool = False
    latent_norm_eps: AnyFloat = 1e-6


@node
class LinearAttentionConfig:
    """The Gated DeltaNet mixer of ``linear_attention`` layers (Hugging Face's
    ``linear_num_key_heads``, ``linear_num_value_heads``, ``linear_key_head_dim``,
    ``linear_value_head_dim``, ``linear_conv_kernel_dim``)."""

    num_key_heads: _Heads
    num_value_heads: _Heads
    key_head_dim: Int(1, limits.MAX_HEAD_DIM)
    value_head_dim: Int(1, limits.MAX_HEAD_DIM)
    conv_kernel: Int(1, limits.MAX_CONV_KERNEL) = 4


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
    # Muse Spark: the final norm's own offset (plain w under (1 + w) block
    # norms); None: as norm_offset.
    final_norm_offset: Bool | None = None
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
    # Qwen3.5 / Qwen3-Next: the mixer of layer_types "linear_attention".
    linear_attention: LinearAttentionConfig | None = None
    # Qwen3.5 / Qwen3-Next full attention: attn * sigmoid(x W_gate) before o_proj.
    attn_output_gate: Bool = False
    # Where each block's norms sit: ``pre_norms`` before the mixer and before
    # the FFN (Llama); ``post_norms`` on the mixer output and on the FFN
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
    # Multi-head latent attention; with it the default mixer is "mla".
    mla: MLAConfig | None = None
    # Storage format per weight kind (megakernel/formats.py), e.g.
    # {"experts": "mxfp4", "dense": "int8"}; absent kinds stay plain.
    quantize: Quantize = Quantize()
    # Muse Spark: both residual adds of every layer become learned gates,
    # alpha * s + beta * branch with u = gate / temperature (ir/kind_residual_gate.py).
    residual_gate_temperature: AnyFloat | None = None
    # Muse Spark: eps of the post norms (post_attn_norm, post_ffn_norm), 1e-8
    # beside its norm_eps of 1e-5; None: norm_eps.
    post_norm_eps: AnyFloat | None = None
    # Muse Spark: False makes the post-attention norm parameter-free.
    post_attn_norm_weight: Bool = True
    # Muse Spark: the post-FFN norm is input-scaled, rms(x * w) instead of
    # rms(x) * w (w as norm_offset says: 1 + w when set).
    post_ffn_norm_input_scaled: Bool = False
    # Muse Spark: False makes the q/k norms parameter-free.
    qk_norm_weight: Bool = True
    # Muse Spark: a parameter-free RMS over each head of the attention output
    # (eps norm_eps), before attn_output_gate and o_proj.
    attn_output_norm: Bool = False
    # Muse Spark: a parameter-free RMS of the embedded token (eps norm_eps),
    # after scale_embeddings, before the first layer.
    embed_norm: Bool = False
    # Muse Spark: the layer types (layer_types names) whose layers have no
    # rotary embedding (NoPE), e.g. ("full_attention",).
    nope_layer_types: tuple[Word, ...] = ()
    # Muse Spark: logits times this before final_logit_softcap (2^-2.5).
    final_logit_scale: AnyFloat = 1.0
    # Muse Spark: ids >= vocab_used are padding rows of the embedding and LM
    # head: never chosen, and their logits are -inf. None: every id is used.
    vocab_used: Int(1, limits.MAX_VOCAB) | None = None

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
        linear = self.layer_types is not None and "linear_attention" in self.layer_types
        if linear and self.linear_attention is None:
            raise IRError("names linear_attention layers but linear_attention is not set",
                          path="layer_types", hint="add a linear_attention block (key and "
                          "value heads, head dims, conv_kernel)")
        if self.linear_attention is not None and not linear:
            raise IRError("is set but no layer_types entry is linear_attention",
                          path="linear_attention",
                          hint="remove it, or name linear_attention layers in layer_types")
        if self.sliding_rope_theta is not None and "sliding_attention" not in (
                self.layer_types or ()):
            raise IRError("sliding_rope_theta is set but layer_types names no "
                          "sliding_attention layer", path="sliding_rope_theta",
                          hint="list the sliding layers in layer_types, or remove it")
        if self.qk_norm_all_heads and not self.qk_norm:
            raise IRError("qk_norm_all_heads is set but qk_norm is not", path="qk_norm_all_heads",
                          hint="set qk_norm, or remove qk_norm_all_heads")
        self._check_muse_options()

    def _check_muse_options(self):
        """The options Muse Spark brought: each names what it needs."""
        if not self.qk_norm_weight and not self.qk_norm:
            raise IRError("qk_norm_weight=false but qk_norm is not set", path="qk_norm_weight",
                          hint="set qk_norm, or remove qk_norm_weight")
        if not self.qk_norm_weight and self.qk_norm_all_heads:
            raise IRError("parameter-free q/k norms are per head only, but qk_norm_all_heads "
                          "is set", path="qk_norm_weight",
                          hint="remove qk_norm_all_heads, or qk_norm_weight")
        post = {"post_norm_eps": self.post_norm_eps is not None,
                "post_attn_norm_weight": not self.post_attn_norm_weight,
                "post_ffn_norm_input_scaled": self.post_ffn_norm_input_scaled}
        for name, used in post.items():
            if used and not self.post_norms:
                raise IRError(f"{name} is set but post_norms is not", path=name,
                              hint=f"set post_norms, or remove {name}")
        if not 0.0 < self.final_logit_scale <= limits.MAX_SCALE:
            raise IRError(f"final_logit_scale={self.final_logit_scale} must be in (0, "
                          f"{limits.MAX_SCALE:g}]", path="final_logit_scale",
                          hint="give a positive multiplier (1.0: none)")
        if self.vocab_used is not None and self.vocab_used > self.vocab_size:
            raise IRError(f"vocab_used={self.vocab_used} exceeds vocab_size={self.vocab_size}",
                          path="vocab_used", hint=f"use at most {self.vocab_size}, or remove it")
        self._check_nope()

    def _check_nope(self):
        mixers = {self.mixer(i) for i in range(self.num_layers)}
        for t in self.nope_layer_types:
            if t not in MIXERS or not MIXERS(t).rotary:
                rotary = sorted(k for k in MIXERS.kinds() if MIXERS(k).rotary)
                raise IRError(f"{t!r} is not a mixer with a rotary embedding; those are "
                              f"{rotary}", path="nope_layer_types",
                              hint="remove it (an MLA block says mla.rope=false instead)")
            if t not in mixers:
                raise IRError(f"names {t!r}, but no layer is one ({sorted(mixers)})",
                              path="nope_layer_types", hint=f"remove {t!r}")
        if len(set(self.nope_layer_types)) != len(self.nope_layer_types):
            raise IRError("names a layer type twice", path="nope_layer_types",
                          hint="list each once")

    def layer_kind(self, index: int) -> str:
        """The FFN of layer ``index``: its name in FFNS."""
        return "moe" if self.moe is not None and index >= self.first_k_dense else "dense"

    def mixer(self, index: int) -> str:
        """The mixer of layer ``index``: its name in MIXERS."""
        if self.layer_types is not None:
            return self.layer_types[index]
        return "mla" if self.mla is not None else "full_attention"

    def to_dict(self) -> dict:
        """The card as a card file holds it, format tag first: ``json.dumps`` of it
        is a file every command loads."""
        return {"format": CARD_FORMAT, **dataclasses.asdict(self)}

    @classmethod
    def from_dict(cls, data: dict) -> "ModelConfig":
        """The card of ``data`` (``format``, when present, must be CARD_FORMAT);
        every unknown, missing or mistyped field is named."""
        if not isinstance(data, dict):
            raise IRError(f"expected an object, found {json_kind(data)}", path="config")
        if "format" in data:
            if data["format"] != CARD_FORMAT:
                raise IRError(f"format={shown(data['format'])}, expected {CARD_FORMAT!r}",
                              path="format")
            data = {k: v for k, v in data.items() if k != "format"}
        return cls(**data)
