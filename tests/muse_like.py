"""A tiny card with every option Muse Spark brought (issue 34 item 1), for the
tests of each layer: parameter-free q/k, attention-output and post-attention
norms, an input-scaled post-FFN norm, residual gates, the attention output's
norm then gate, an embedding norm, NoPE full-attention layers beside RoPE
sliding ones, a logit scale before the soft-cap, padding ids, and Muse Spark's
eps pair and query scale (qk_scale_factor / sqrt(head_dim)). Not a zoo model:
its sizes are a test's, not a published model's."""

import dataclasses

from megakernel.ir.config import ModelConfig

MUSE_LIKE = ModelConfig(
    name="tiny-muse", vocab_size=512, hidden_size=256, num_layers=2, num_q_heads=4,
    num_kv_heads=2, head_dim=64, intermediate_size=512, activation="silu",
    norm_eps=1e-5, norm_offset=True, rope_theta=5e5, qk_norm=True, qk_norm_weight=False,
    sliding_window=8, layer_types=("sliding_attention", "full_attention"),
    nope_layer_types=("full_attention",), softmax_scale=5.4730064863875 / 8.0,
    attn_output_norm=True, attn_output_gate=True, post_norms=True, post_norm_eps=1e-8,
    post_attn_norm_weight=False, post_ffn_norm_input_scaled=True,
    residual_gate_temperature=0.3, embed_norm=True, final_logit_scale=2 ** -2.5,
    final_logit_softcap=20.0, vocab_used=500, dtype="float32", max_seq_len=64)


def muse_like(**changes) -> ModelConfig:
    return dataclasses.replace(MUSE_LIKE, **changes)
