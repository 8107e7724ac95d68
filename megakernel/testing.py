"""Hypothesis strategies for users' (and our own) property tests.

``model_configs()`` draws cards inside the supported space; ``decode_cases(model)``
draws batch size, tokens per step, start positions and token ids for a model.
Sizes default to small values so each draw runs fast on a CPU.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
from hypothesis import strategies as st

from megakernel.ir.config import MoEConfig, ModelConfig


@st.composite
def moe_configs(draw, max_experts: int = 16) -> MoEConfig:
    num_experts = draw(st.integers(4, max_experts))
    shared = draw(st.integers(0, 1))
    return MoEConfig(
        num_experts=num_experts,
        top_k=draw(st.integers(1, min(4, num_experts))),
        expert_intermediate=draw(st.sampled_from([128, 256])),
        scoring=draw(st.sampled_from(["softmax", "sigmoid"])),
        correction_bias=draw(st.booleans()),
        renormalize=draw(st.booleans()),
        routed_scaling=draw(st.sampled_from([1.0, 2.5])),
        num_shared_experts=shared,
        shared_intermediate=128 if shared else 0,
    )


@st.composite
def model_configs(draw, *, max_layers: int = 4, hidden_sizes=(128, 256, 384, 512),
                  moe: bool | None = None, dtype: str | None = None) -> ModelConfig:
    """A valid card: dense or MoE (``moe=None`` draws either), 1..max_layers layers."""
    hidden = draw(st.sampled_from(hidden_sizes))
    kv_heads = draw(st.sampled_from([1, 2, 4]))
    q_heads = kv_heads * draw(st.sampled_from([1, 2, 4]))
    head_dim = draw(st.sampled_from([64, 128]))
    num_layers = draw(st.integers(1, max_layers))
    use_moe = draw(st.booleans()) if moe is None else moe
    moe_cfg = draw(moe_configs()) if use_moe else None
    first_k_dense = draw(st.integers(0, num_layers - 1)) if use_moe else 0
    rotary = draw(st.sampled_from([0, head_dim // 2]))
    scaling = draw(st.sampled_from([None, {"rope_type": "llama3", "factor": 8.0,
                                           "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                           "original_max_position": 64}]))
    return ModelConfig(
        name="drawn",
        vocab_size=draw(st.sampled_from([256, 512])),
        hidden_size=hidden,
        num_layers=num_layers,
        num_q_heads=q_heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=draw(st.sampled_from([256, 512])),
        activation=draw(st.sampled_from(["silu", "gelu", "gelu_tanh"])),
        norm_eps=draw(st.sampled_from([1e-5, 1e-6])),
        norm_offset=draw(st.booleans()),
        rope_theta=draw(st.sampled_from([10000.0, 1e6])),
        rotary_dim=rotary,
        rope_scaling=scaling,
        qkv_bias=draw(st.booleans()),
        qk_norm=draw(st.booleans()),
        sliding_window=draw(st.sampled_from([None, 4, 16])),
        tie_embeddings=draw(st.booleans()),
        dtype=dtype or draw(st.sampled_from(["float32", "bfloat16"])),
        max_seq_len=64,
        moe=moe_cfg,
        first_k_dense=first_k_dense,
    )


@dataclass(frozen=True)
class DecodeCase:
    """One decode call: ``tokens`` [B, T] at ``start`` [B], after a prefill of
    ``start[b]`` tokens ``prompt[b, :start[b]]``."""

    prompt: np.ndarray   # [B, max(start)] int32
    start: np.ndarray    # [B] int32
    tokens: np.ndarray   # [B, T] int32

    @property
    def batch(self) -> int:
        return int(self.tokens.shape[0])


@st.composite
def decode_cases(draw, model, *, max_batch: int = 8, max_tokens: int = 4,
                 max_context: int | None = None) -> DecodeCase:
    b = draw(st.integers(1, max_batch))
    t = draw(st.integers(1, max_tokens))
    ctx = min(max_context or model.max_seq_len, model.max_seq_len) - t
    start = np.array(draw(st.lists(st.integers(0, max(ctx, 0)), min_size=b, max_size=b)),
                     np.int32)
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    prompt = rng.integers(0, model.vocab_size, (b, max(int(start.max()), 1)), dtype=np.int32)
    tokens = rng.integers(0, model.vocab_size, (b, t), dtype=np.int32)
    return DecodeCase(prompt, start, tokens)


def replace(config: ModelConfig, **changes) -> ModelConfig:
    """``dataclasses.replace`` for cards, also reaching into ``moe`` with ``moe__field``."""
    moe_changes = {k[5:]: v for k, v in changes.items() if k.startswith("moe__")}
    top = {k: v for k, v in changes.items() if not k.startswith("moe__")}
    if moe_changes:
        top["moe"] = dataclasses.replace(config.moe, **moe_changes)
    return dataclasses.replace(config, **top)
