"""Multi-head latent attention cards (DeepSeek-V3, Kimi-K2) for ``model_configs(mla=...)``
(strategies.py): the latent block's dims, and what MLA layers refuse of the
features of the table."""

from __future__ import annotations

import dataclasses

from hypothesis import strategies as st

from megakernel.ir.config import MLAConfig

# The features of GQA attention that multi-head latent attention layers refuse
# (and, by their needs, layer_pattern, sliding_rope_theta and qk_norm_all_heads);
# an MLA card's rotary part is its own (rotary_dim 0), and a rope scaling needs
# latent.rope. NoPE layer types name GQA mixers only (an MLA block's NoPE is
# its rope=false); attn_output_gate is GQA attention's (MLA's is output_gate).
# (quantized_dense: the drawn MLA widths, v_head_dim 48 per core, are not whole
# code tiles of the formats.)
MLA_REFUSES = frozenset({"sliding_window", "qk_norm", "attn_logit_softcap", "attention_sinks",
                         "quantized_dense", "quantized_experts", "attn_output_norm",
                         "attn_output_gate", "nope"})
ROPE_SCALINGS = frozenset({"rope_llama3", "rope_yarn", "rope_linear", "rope_yarn_mscale"})


@st.composite
def mla_blocks(draw) -> MLAConfig:
    """Multi-head latent attention dims that tile: latent rank, nope / rope /
    value widths (value width independent of the key's), q LoRA or not, NoPE,
    output gate."""
    return MLAConfig(kv_lora_rank=draw(st.sampled_from([64, 128])),
                     qk_nope_head_dim=draw(st.sampled_from([32, 64])),
                     qk_rope_head_dim=draw(st.sampled_from([16, 32])),
                     v_head_dim=draw(st.sampled_from([32, 48, 64])),
                     q_lora_rank=draw(st.sampled_from([0, 64])),
                     rope=draw(st.booleans()), output_gate=draw(st.booleans()))


def refused_by(latent: MLAConfig) -> frozenset[str]:
    return MLA_REFUSES | (frozenset() if latent.rope else ROPE_SCALINGS)


@st.composite
def latent_blocks(draw, mla: bool | None, required) -> MLAConfig | None:
    """The MLA block of a card (None: GQA attention): always when ``mla``, on a
    coin when None unless a ``required`` feature is one MLA refuses; with
    latent.rope when a rope scaling is required."""
    if not (mla or (mla is None and not set(required) & MLA_REFUSES and draw(st.booleans()))):
        return None
    latent = draw(mla_blocks())
    if set(required) & ROPE_SCALINGS:
        latent = dataclasses.replace(latent, rope=True)
    clash = sorted(set(required) & refused_by(latent))
    if clash:
        raise ValueError(f"model_configs(mla=True): MLA layers refuse {clash}")
    return latent
