"""Which Hugging Face tensors each IR weight of a checkpoint is read from.

``NAMES`` maps a ``model_type`` to its table: IR layer weight suffix -> the HF
tensors (``Source``: a name and its reshape rule) tried in order, under
``LAYER_PREFIX`` or the family's ``PREFIXES``; ``GLOBAL`` holds the weights
outside the layers. The hybrid linear-attention families register their rows
and prefixes from models/checkpoint_hybrid.py, and DeepSeek's families build
their table from their config (models/hf_deepseek.py); models/checkpoint_families.py
(which imports both) gives any family's table, and models/checkpoint.py reads
the tensors with it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Source:
    """An HF tensor name (``{e}`` stands for the expert), its reshape rule and
    the rule's extra arguments (head counts, for the families that need them)."""

    name: str
    rule: str = "copy"
    args: tuple = ()


def _attn_mlp() -> dict[str, tuple[Source, ...]]:
    t = {"input_norm.weight": (Source("input_layernorm.weight"),),
         "post_norm.weight": (Source("post_attention_layernorm.weight"),),
         "q_norm.weight": (Source("self_attn.q_norm.weight"),),
         "k_norm.weight": (Source("self_attn.k_norm.weight"),)}
    for p in "qkvo":
        t[f"{p}_proj.weight"] = (Source(f"self_attn.{p}_proj.weight", "T"),)
        t[f"{p}_proj.bias"] = (Source(f"self_attn.{p}_proj.bias"),)
    for p in ("gate", "up", "down"):
        t[f"mlp.{p}"] = (Source(f"mlp.{p}_proj.weight", "T"),)
    return t


def _moe(router: tuple[str, ...], per_expert: dict[str, str],
         fused: tuple[str, ...]) -> dict[str, tuple[Source, ...]]:
    """MoE rows: ``per_expert`` maps gate/up/down to one expert's tensor name;
    ``fused`` are the prefixes under which fused expert tensors may live."""
    t = {"moe.router": tuple(Source(r, "T") for r in router)}
    for part, name in per_expert.items():
        fused_name = "gate_up_proj" if part != "down" else "down_proj"
        t[f"moe.experts_{part}"] = (Source(name, "experts_T"),) + tuple(
            Source(f"{f}.{fused_name}", f"fused_{part}") for f in fused)
    return t


_ATTN_MLP = _attn_mlp()
LAYER_PREFIX = "model.layers.{i}."
GLOBAL: dict[str, tuple[Source, ...]] = {
    # (published vision-language checkpoints keep the text model under model.language_model)
    "embed.weight": (Source("model.embed_tokens.weight"),
                     Source("model.language_model.embed_tokens.weight")),
    "final_norm.weight": (Source("model.norm.weight"), Source("model.language_model.norm.weight")),
    "lm_head.weight": (Source("lm_head.weight", "T"),),
}
# model_type -> the prefixes a layer's tensors may live under (default LAYER_PREFIX).
PREFIXES: dict[str, tuple[str, ...]] = {}
# model_type -> prefixes of tensors outside the decode step (a vision tower, a
# multi-token-prediction head) that transformers' causal LM ignores on load too.
IGNORED_PREFIXES: dict[str, tuple[str, ...]] = {}
# model_type -> IR layer weight suffix -> HF sources (under LAYER_PREFIX), tried in order.
NAMES: dict[str, dict[str, tuple[Source, ...]]] = {
    "llama": _ATTN_MLP,
    "qwen2": _ATTN_MLP,
    "qwen3": _ATTN_MLP,
    "qwen3_moe": {**_ATTN_MLP, **_moe(
        ("mlp.gate.weight",),
        {p: f"mlp.experts.{{e}}.{p}_proj.weight" for p in ("gate", "up", "down")},
        ("mlp.experts",))},
    "mixtral": {**_ATTN_MLP, **_moe(
        ("block_sparse_moe.gate.weight", "mlp.gate.weight"),
        {"gate": "block_sparse_moe.experts.{e}.w1.weight",
         "up": "block_sparse_moe.experts.{e}.w3.weight",
         "down": "block_sparse_moe.experts.{e}.w2.weight"},
        ("block_sparse_moe.experts", "mlp.experts"))},
}
_GEMMA = {**_ATTN_MLP,
          "post_norm.weight": (Source("pre_feedforward_layernorm.weight"),),
          "post_attn_norm.weight": (Source("post_attention_layernorm.weight"),),
          "post_ffn_norm.weight": (Source("post_feedforward_layernorm.weight"),)}
NAMES.update({
    "mistral": _ATTN_MLP,
    "gemma2": _GEMMA,
    "gemma3_text": _GEMMA,
    "olmo2": {**_ATTN_MLP,
              "post_attn_norm.weight": (Source("post_attention_layernorm.weight"),),
              "post_ffn_norm.weight": (Source("post_feedforward_layernorm.weight"),)},
    # Phi-3 fuses q|k|v and gate|up along the output rows: split at load.
    "phi3": {**_ATTN_MLP,
             **{f"{p}_proj.weight": (Source("self_attn.qkv_proj.weight", f"rows_{p}"),)
                for p in "qkv"},
             "mlp.gate": (Source("mlp.gate_up_proj.weight", "rows_gate"),),
             "mlp.up": (Source("mlp.gate_up_proj.weight", "rows_up"),)},
    # gpt-oss stores experts stacked and [in, out], gate and up interleaved
    # along the columns (gate even, up odd), each with a bias.
    "gpt_oss": {**_ATTN_MLP,
                "attention.sinks": (Source("self_attn.sinks"),),
                "moe.router": (Source("mlp.router.weight", "T"),),
                "moe.router_logit_bias": (Source("mlp.router.bias"),),
                "moe.experts_gate": (Source("mlp.experts.gate_up_proj", "even"),),
                "moe.experts_up": (Source("mlp.experts.gate_up_proj", "odd"),),
                "moe.experts_down": (Source("mlp.experts.down_proj"),),
                "moe.experts_gate_bias": (Source("mlp.experts.gate_up_proj_bias", "even"),),
                "moe.experts_up_bias": (Source("mlp.experts.gate_up_proj_bias", "odd"),),
                "moe.experts_down_bias": (Source("mlp.experts.down_proj_bias"),)},
})


def _muse_spark() -> dict[str, tuple[Source, ...]]:
    """Muse Spark's text model (models/hf_muse.py): Llama's attention rows, the
    output gate's projection, both residual gates, the (1 + w) norms (the
    post-attention norm has no weight), the router with its selection bias,
    and the latent MoE around its experts. Experts come fused ([E, 2I, L] and
    [E, L, I], transformers' save) or one module per expert and projection
    (compressed-tensors' NVFP4 save)."""
    t = {k: _ATTN_MLP[k] for k in ("input_norm.weight", *(f"{p}_proj.weight" for p in "qkvo"))}
    t.update(_moe(("mlp.gate.weight",),
                  {p: f"mlp.experts.{{e}}.{p}_proj.weight" for p in ("gate", "up", "down")},
                  ("mlp.experts",)))
    for ir, hf in (("post_norm.weight", "pre_feedforward_layernorm.weight"),
                   ("post_ffn_norm.weight", "post_feedforward_layernorm.weight"),
                   ("attn_residual.gate", "post_attention_residual_gate.gate"),
                   ("ffn_residual.gate", "post_feedforward_residual_gate.gate"),
                   ("moe.router_bias", "mlp.gate.e_score_correction_bias"),
                   ("pre_expert_norm.weight", "mlp.pre_expert_norm.weight"),
                   ("expert_combine.weight", "mlp.experts.post_expert_norm.weight")):
        t[ir] = (Source(hf),)
    for ir, hf in (("gate_proj.weight", "self_attn.gate_proj.weight"),
                   ("pre_expert_proj.weight", "mlp.pre_expert_proj.weight"),
                   ("post_expert_proj.weight", "mlp.post_expert_proj.weight")):
        t[ir] = (Source(hf, "T"),)
    return t


# Muse Spark's checkpoint is the multimodal one: the text model's layers under
# model.language_model (its embedding and final norm: GLOBAL's second names,
# lm_head at the root); the towers never reach the text logits.
NAMES["muse_spark"] = _muse_spark()
PREFIXES["muse_spark"] = ("model.language_model.layers.{i}.",)
IGNORED_PREFIXES["muse_spark"] = ("model.vision_tower.", "model.vision_adapter.",
                                  "model.vision_projection.", "model.audio_tower.")


def weight_sources(names: dict, weight: str) -> tuple[tuple[Source, ...], int | None]:
    """The sources of IR weight ``weight`` (in ``GLOBAL``, or its row of the
    layer table ``names``) and its layer index (None outside the layers)."""
    if weight in GLOBAL:
        return GLOBAL[weight], None
    _, i, suffix = weight.split(".", 2)
    return names.get(suffix, ()), int(i)
