"""Hugging Face import of the hybrid linear-attention families (models/hf.py rows
``qwen3_5``, ``qwen3_5_text``, ``qwen3_next``): Gated DeltaNet layers and gated
full-attention layers (facts in tests/fixtures/hf/README.md, checked against
transformers 5.24).

``unwrap`` turns a Qwen3.5 vision-language config (``model_type`` qwen3_5 with
a ``text_config``) into its text config: the vision tower takes no part in a
text decode step, and ``Qwen3_5ForCausalLM`` reads only the text config.
``hybrid_fields`` reads the keys of the mixers: ``layer_types`` (or
``full_attention_interval``), the ``linear_*`` sizes, and the keys
transformers carries along but never reads (the attention output is always
gated, the GDN gate is always SiLU, the SSM state always float32): values that
would mean another model are reported, never ignored. The partial rotary
factor is read by ``hf_rope.read_rope`` with ``ROPE``.
"""

from __future__ import annotations

from typing import Any

from megakernel.errors import ConfigError, shown
from megakernel.ir import limits
from megakernel.ir.config import LinearAttentionConfig
from megakernel.models.hf_fields import FieldReader

# Top-level keys of a Qwen3.5 VLM config that only its vision tower reads.
VISION_KEYS = frozenset({"vision_config", "image_token_id", "video_token_id",
                         "vision_start_token_id", "vision_end_token_id"})
# hf_rope.read_rope's options: partial rotary, a quarter of the head when the
# factor is absent (transformers' default); inside rope_parameters, the
# multimodal sections, which give every frequency the same position for text
# (3 equal position rows), i.e. plain partial RoPE.
ROPE = dict(partial_default=0.25, extra_keys=("mrope_section", "mrope_interleaved"))
MIXERS = ("linear_attention", "full_attention")


def unwrap(data: dict[str, Any], source: str) -> dict[str, Any]:
    """The text config of a qwen3_5 VLM config (others are returned as they are);
    a top-level key that contradicts the text config is an error."""
    if data.get("model_type") != "qwen3_5" or "text_config" not in data:
        return data
    text = data["text_config"]
    if not isinstance(text, dict):
        raise ConfigError(f"text_config: expected an object, found {shown(text)}", path=source)
    out = {k: v for k, v in text.items() if k != "model_type"}
    out["model_type"] = "qwen3_5"
    for key, value in data.items():
        if key in VISION_KEYS or key in ("text_config", "model_type"):
            continue
        if key in out and out[key] != value and key not in ("architectures",):
            raise ConfigError(f"{key}={shown(value)} differs from text_config.{key}="
                              f"{shown(out[key])}", path=source,
                              hint="make the two agree (the text model reads text_config)")
        out.setdefault(key, value)
    return out


def hybrid_fields(r: FieldReader, fields: dict[str, Any], *, dense: bool) -> dict[str, Any]:
    """Card fields of the mixers (layer_types, linear_attention, the output
    gate); problems are recorded in ``r``. ``dense``: the
    family has no MoE, so ``mlp_only_layers`` (written by Qwen3.5) must be empty."""
    n = fields.get("num_layers") or 0
    size = lambda key, default, high: r.get(key, int, default, low=1, high=high)  # noqa: E731
    la = dict(num_key_heads=size("linear_num_key_heads", 16, limits.MAX_HEADS),
              num_value_heads=size("linear_num_value_heads", 32, limits.MAX_HEADS),
              key_head_dim=size("linear_key_head_dim", 128, limits.MAX_HEAD_DIM),
              value_head_dim=size("linear_value_head_dim", 128, limits.MAX_HEAD_DIM),
              conv_kernel=size("linear_conv_kernel_dim", 4, limits.MAX_CONV_KERNEL))
    out: dict[str, Any] = {"attn_output_gate": True, "layer_types": _layer_types(r, n)}
    if "linear_attention" in out["layer_types"]:
        out["linear_attention"] = LinearAttentionConfig(**{k: v or 1 for k, v in la.items()})
    _carried_keys(r)
    if dense and r.get("mlp_only_layers", list, []):
        r.problem("mlp_only_layers", "is not empty, but every layer of this family is dense")
    return out


def _layer_types(r: FieldReader, n: int) -> tuple[str, ...]:
    interval = r.get("full_attention_interval", int, 4, low=1, high=limits.MAX_LAYERS) or 4
    types = r.get("layer_types", list, None)
    if types is None:       # transformers' __post_init__ rule
        return tuple("full_attention" if (i + 1) % interval == 0 else "linear_attention"
                     for i in range(n))
    if len(types) != n or any(t not in MIXERS for t in types):
        r.problem("layer_types", f"{shown(types)} should list {n} of {list(MIXERS)}")
        return ("full_attention",) * n
    return tuple(types)


def _carried_keys(r: FieldReader) -> None:
    """Keys transformers carries but does not read: only the values it implies pass."""
    fixed = {"attn_output_gate": (bool, True, "the attention output is always gated"),
             "output_gate_type": (str, "swish", "the GDN output gate is always silu(z)"),
             "mamba_ssm_dtype": (str, "float32", "the recurrent state is always float32"),
             "use_sliding_window": (bool, False, "these models have no sliding window")}
    for key, (kind, want, why) in fixed.items():
        got = r.get(key, kind, want)
        if got is not None and got != want and not (key == "output_gate_type" and got == "silu"):
            r.problem(key, f"{shown(got)} is not supported: in transformers {why}")
    if r.get("sliding_window", int, None) is not None:
        r.problem("sliding_window", "is set, but these models have no sliding window")
    # The multi-token-prediction layer is a draft head outside the decode step
    # (transformers' causal LM ignores its weights).
    r.mark_used("mtp_num_hidden_layers", "mtp_use_dedicated_embeddings", "max_window_layers")
