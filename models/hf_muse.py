"""Hugging Face ``muse_spark`` import: the text model of Muse Spark's multimodal
checkpoint (transformers >= 5.25; facts in tests/fixtures/hf/README.md, "Muse Spark").

``unwrap`` turns the multimodal config (``model_type`` muse_spark, the text model
under ``text_config``, the vision and audio towers beside it) into its text
config: the towers take no part in a text decode step. ``import_fields`` maps
the text config onto the card's general options:

* residual gates (``residual_gate_temperature``) in place of both residual adds;
* (1 + w) pre-norms at ``rms_norm_eps``; a parameter-free post-attention norm
  and an input-scaled post-FFN norm at ``post_norm_eps``; a parameter-free
  norm of the embedded token; the final norm's plain w;
* sliding-window layers with RoPE, full-attention layers with none (HF's
  ``layer_rope_theta`` of 0; its non-zero entries are never read, one global
  theta serves every RoPE layer); parameter-free QK norms; the query scale
  ``qk_scale_factor`` times 1/sqrt(head_dim); a parameter-free norm over each
  head of the attention output, then ``sigmoid(x W_gate)``;
* the latent MoE: ``pre_expert_proj`` and its (1 + w) norm, experts at
  ``moe_hidden_size``, a per-expert input-scaled output norm at
  ``post_norm_eps``, ``post_expert_proj``; the router in f32 on the logits
  times ``output_multiplier``, sigmoid, a selection bias, weights renormalised
  with 1e-15;
* the final logits times ``output_multiplier`` before the soft-cap.

Not represented: HF replaces every image, video and audio placeholder id
(``image_token_id`` ...) by id 0 before the embedding, also in text-only
calls; the card embeds each id as itself, so a prompt holding those ids
differs from HF's logits (no fixture id reaches them).

The checkpoint's tensor names (the text model under ``model.language_model.``,
the towers ignored) are models/checkpoint_names.py's ``muse_spark`` rows.
"""

from __future__ import annotations

import math
from typing import Any

from megakernel.errors import ConfigError, shown
from megakernel.ir import limits
from megakernel.ir.config import MoEConfig
from megakernel.models.hf_fields import ACTIVATIONS, REQUIRED, FieldReader
from megakernel.models.hf_rope import read_rope

# Top-level keys of the multimodal config that only its towers read.
TOWER_KEYS = frozenset({"vision_config", "audio_config", "image_token_id", "video_token_id",
                        "audio_token_id", "out_hidden_size", "projector_hidden_size",
                        "projector_hidden_act"})
RENORM_EPS = 1e-15            # MuseSparkTopkRouter's constant, not a config key
MIXERS = ("sliding_attention", "full_attention")


def unwrap(data: dict[str, Any], source: str) -> dict[str, Any]:
    """The text config of a muse_spark config (others are returned as they are);
    a top-level key that contradicts the text config is an error."""
    if data.get("model_type") != "muse_spark":
        return data
    text = data.get("text_config")
    if not isinstance(text, dict):
        raise ConfigError(f"text_config: expected an object, found {shown(text)}",
                          path=source, hint="a muse_spark config keeps its text model there")
    out = {k: v for k, v in text.items() if k != "model_type"}
    out["model_type"] = "muse_spark"
    for key, value in data.items():
        if key in TOWER_KEYS or key in ("text_config", "model_type", "architectures"):
            continue
        if key in out and out[key] != value:
            raise ConfigError(f"{key}={shown(value)} differs from text_config.{key}="
                              f"{shown(out[key])}", path=source,
                              hint="make the two agree (the text model reads text_config)")
        out.setdefault(key, value)
    return out


def import_fields(r: FieldReader) -> dict[str, Any]:
    """Card fields of a muse_spark text config (problems recorded in ``r``)."""
    size = lambda key, high, default=REQUIRED: r.get(key, int, default, low=1, high=high)  # noqa: E731
    n = size("num_hidden_layers", limits.MAX_LAYERS) or 0
    head_dim = size("head_dim", limits.MAX_HEAD_DIM, 64)
    eps = lambda key, default: r.get(key, float, default, low=limits.NORM_EPS[0],  # noqa: E731
                                     high=limits.NORM_EPS[1])
    out = dict(
        vocab_size=size("vocab_size", limits.MAX_VOCAB), hidden_size=size("hidden_size",
                                                                        limits.MAX_WIDTH),
        num_layers=n, num_q_heads=size("num_attention_heads", limits.MAX_HEADS),
        num_kv_heads=size("num_key_value_heads", limits.MAX_HEADS), head_dim=head_dim,
        intermediate_size=size("intermediate_size", limits.MAX_WIDTH, 16384),
        norm_eps=eps("rms_norm_eps", 1e-5), norm_offset=True, final_norm_offset=False,
        post_norm_eps=eps("post_norm_eps", 1e-8), pre_norms=True, post_norms=True,
        post_attn_norm_weight=False, post_ffn_norm_input_scaled=True, embed_norm=True,
        qk_norm=True, qk_norm_weight=False, attn_output_norm=True, attn_output_gate=True,
        tie_embeddings=False,
        residual_gate_temperature=r.get("residual_gate_temperature", float, 0.3, low=0.0,
                                        high=limits.MAX_SCALE, open_low=True))
    # MuseSparkForConditionalGeneration declares no tied weights, so transformers
    # ties nothing whatever tie_word_embeddings says (read for its type only):
    # lm_head.weight is always its own tensor.
    r.get("tie_word_embeddings", bool, False)
    act = r.get("hidden_act", str, "silu")
    if act not in ACTIVATIONS:
        r.problem("hidden_act", f"{act!r} is not supported; supported: {sorted(ACTIVATIONS)}")
    out["activation"] = ACTIVATIONS.get(act, "silu")
    if r.get("attention_bias", bool, False):
        r.problem("attention_bias", "true is not supported, expected false (the "
                  "released model's projections have no bias; none is read)")
    q_scale = r.get("qk_scale_factor", float, 5.4730064863875, low=0.0,
                    high=limits.MAX_SCALE, open_low=True)
    if q_scale and head_dim:
        out["softmax_scale"] = q_scale / math.sqrt(head_dim)
    out.update(read_rope(r, 5e5, by_type=False, partial=False, head_dim=head_dim))
    out.update(_layers(r, n))
    multiplier = r.get("output_multiplier", float, 0.1767766952966369, low=0.0,
                       high=limits.MAX_SCALE, open_low=True) or 1.0
    cap = r.get("final_logit_softcapping", float, 20.0, low=0.0, high=limits.MAX_SCALE,
                open_low=True)
    out.update(final_logit_scale=multiplier, final_logit_softcap=cap)
    out["moe"] = _moe(r, out, multiplier)
    return out


def _layers(r: FieldReader, n: int) -> dict[str, Any]:
    """``layer_types`` and ``sliding_window``, the NoPE layer types from
    ``layer_rope_theta``, and every layer sparse (``mlp_layer_types``)."""
    default = ["full_attention" if (n - 1 - i) % 4 == 0 else "sliding_attention"
               for i in range(n)]         # every 4th counted from the last (HF's default)
    types = r.get("layer_types", list, default)
    if len(types) != n or any(t not in MIXERS for t in types):
        r.problem("layer_types", f"{shown(types)} should list {n} of {list(MIXERS)}")
        return {}
    # HF's default NoPE layers follow the index pattern, not layer_types.
    thetas = r.get("layer_rope_theta", list, [0.0 if (n - 1 - i) % 4 == 0 else 5e5
                                              for i in range(n)])
    if len(thetas) != n or not all(isinstance(x, (int, float)) and x >= 0 for x in thetas):
        r.problem("layer_rope_theta", f"{shown(thetas)} should list {n} numbers >= 0")
        return {}
    nope = sorted({t for t, x in zip(types, thetas) if x == 0})
    for t in nope:
        if any(x != 0 for u, x in zip(types, thetas) if u == t):
            r.problem("layer_rope_theta", f"{shown(thetas)} is 0 for some {t} layers "
                      "only; the card gives every layer of a type RoPE or none "
                      "(nope_layer_types): make the list 0 on all of them or on none")
    mlps = r.get("mlp_layer_types", list, ["sparse"] * n)
    if mlps != ["sparse"] * n:
        r.problem("mlp_layer_types", f"{shown(mlps)}: only all-sparse layers are supported "
                  "(the released model's)")
    window = r.get("sliding_window", int, 2048, low=1, high=limits.MAX_SEQ_LEN)
    fields: dict[str, Any] = {"nope_layer_types": tuple(nope)}
    if "sliding_attention" in types:
        fields.update(sliding_window=window, layer_types=tuple(types))
    return fields


def _moe(r: FieldReader, fields: dict, multiplier: float) -> MoEConfig:
    experts = r.get("num_local_experts", int, 256, low=1, high=limits.MAX_EXPERTS) or 1
    top_k = r.get("num_experts_per_tok", int, 8, low=1, high=limits.MAX_EXPERTS) or 1
    if r.get("num_shared_experts", int, 0, low=0, high=limits.MAX_SHARED_EXPERTS):
        r.problem("num_shared_experts", "is not 0: MuseSparkMoE has no shared expert")
    return MoEConfig(
        experts, top_k, r.get("moe_intermediate_size", int, 4096, low=1,
                              high=limits.MAX_WIDTH) or 1,
        "sigmoid", correction_bias=True, renormalize=True,
        routed_scaling=r.get("routed_scaling_factor", float, 1.0, low=0.0, high=1e3,
                             open_low=True) or 1.0,
        latent_size=r.get("moe_hidden_size", int, 4096, low=1, high=limits.MAX_WIDTH) or 1,
        latent_input_norm=True, expert_output_norm="per_expert",
        expert_output_norm_eps=fields["post_norm_eps"], expert_output_norm_input_scaled=True,
        router_logit_scale=multiplier, renormalize_eps=RENORM_EPS, router_f32=True)


IMPORTERS = {"muse_spark": import_fields}

