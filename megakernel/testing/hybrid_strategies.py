"""``hybrid_configs()``: Qwen3.5-like hybrid cards, Gated DeltaNet layers beside
gated full attention, with the table's features that apply to any mixer
(strategies.py) drawn as ``model_configs`` draws them."""

from __future__ import annotations

from hypothesis import strategies as st

from megakernel.ir.config import LinearAttentionConfig, MoEConfig, ModelConfig
from megakernel.testing.strategies import FEATURES, add_features, restrict

# The table's features a hybrid card draws: norm placement (no input norms only
# in float32, by the table's rule) and its variants, residual gates, soft-caps,
# sinks, the embedding scale and norm, the attention output's norm (before the
# hybrids' output gate), NoPE attention layers, the logit scale, padding ids, bf16.
HYBRID_FEATURES = ("bfloat16", "post_norms", "post_norms_only", "scale_embeddings",
                   "attn_logit_softcap", "attention_sinks", "final_logit_softcap",
                   "residual_gates", "post_norm_eps", "free_post_attn_norm",
                   "post_ffn_input_scaled", "attn_output_norm", "embed_norm", "nope",
                   "final_logit_scale", "vocab_used")


@st.composite
def hybrid_configs(draw, *, cores: int = 1, max_periods: int = 2,
                   dtype: str | None = None) -> ModelConfig:
    """A valid Qwen3.5-like hybrid card: 1-3 Gated DeltaNet layers then one gated
    full-attention layer, repeated 1..max_periods times, with key, value, query and
    KV head counts that split (or, for key and KV heads, replicate) over ``cores``;
    half the draws use Qwen3-Next's MoE with a sigmoid-gated shared expert; and
    ``HYBRID_FEATURES`` on a coin (``dtype=`` fixes the weights' dtype)."""
    linear = draw(st.integers(1, 3))
    periods = draw(st.integers(1, max_periods))
    fits = lambda h: h % cores == 0 or cores % h == 0  # noqa: E731
    hk = draw(st.sampled_from([h for h in (1, 2, 4) if fits(h)]))
    hv = draw(st.sampled_from([hk * r for r in (1, 2, 4) if (hk * r) % cores == 0
                               and hk * r <= 8]))
    kv = draw(st.sampled_from([h for h in (1, 2) if fits(h)]))
    q = draw(st.sampled_from([kv * g for g in (1, 2, 4) if (kv * g) % cores == 0]))
    head_dim = draw(st.sampled_from([32, 64]))
    moe = None
    if draw(st.booleans()):
        moe = MoEConfig(num_experts=4, top_k=2, expert_intermediate=128, renormalize=True,
                        num_shared_experts=1, shared_intermediate=128, shared_expert_gate=True)
    off, on = restrict(set(FEATURES) - set(HYBRID_FEATURES), (), dtype=dtype)
    card = ModelConfig(
        name="drawn-hybrid", vocab_size=256, hidden_size=128,
        num_layers=(linear + 1) * periods, num_q_heads=q, num_kv_heads=kv,
        head_dim=head_dim, intermediate_size=256, norm_offset=True, qk_norm=True,
        rotary_dim=draw(st.sampled_from([head_dim // 4, head_dim])), rope_theta=1e7,
        attn_output_gate=True, dtype=dtype if dtype and dtype != "bfloat16" else "float32",
        max_seq_len=64, moe=moe,
        layer_types=(("linear_attention",) * linear + ("full_attention",)) * periods,
        linear_attention=LinearAttentionConfig(
            hk, hv, draw(st.sampled_from([16, 32])), draw(st.sampled_from([16, 32])),
            draw(st.integers(2, 4))))
    return add_features(draw, card, cores, off, on)
