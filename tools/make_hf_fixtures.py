#!/usr/bin/env python3
"""Generate tiny random Hugging Face checkpoints plus reference logits.

These fixtures give the megakernel an *independent* parity check: the expected
logits come from the Hugging Face `transformers` implementation itself, not from
this project's reference code.

Run inside the separate `.venv-hf` virtualenv (torch CPU + transformers); the
normal project venv does not need torch.  Use `make hf-fixtures`.

For every family a folder tests/fixtures/hf/<name>/ is written with
  config.json, model.safetensors (bf16 weights, as written by save_pretrained),
  expected.npz (token ids + float32 logits for a prefill and two decode steps;
  Gated DeltaNet families also store HF's conv/recurrent cache states).
<name> is the model_type, except qwen3_5 (model_type qwen3_5_text) and
deepseek_v3_nolora (model_type deepseek_v3).  The first five families are
family_specs(); the wave-2 families are wave2_specs().

The expected logits are computed in float32 (eager attention) by a model that
is *reloaded from the saved bf16 checkpoint* with dtype=float32, so they match
exactly what a loader of the fixture files sees.

Usage:
  python tools/make_hf_fixtures.py [--out DIR] [--only FAMILY ...]
  python tools/make_hf_fixtures.py --verify [--out DIR] [--only FAMILY ...]   # reload + recheck
"""

from __future__ import annotations

import argparse
import inspect
import math
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import (  # noqa: E402
    AutoConfig,
    AutoModelForCausalLM,
    DeepseekV3Config,
    DeepseekV3ForCausalLM,
    Gemma2Config,
    Gemma2ForCausalLM,
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    GptOssConfig,
    GptOssForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    MixtralConfig,
    MixtralForCausalLM,
    Olmo2Config,
    Olmo2ForCausalLM,
    Phi3Config,
    Phi3ForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3_5ForCausalLM,
    Qwen3_5TextConfig,
    Qwen3Config,
    Qwen3ForCausalLM,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
    Qwen3NextConfig,
    Qwen3NextForCausalLM,
)

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO_ROOT / "tests" / "fixtures" / "hf"

B = 2  # batch
T0 = 5  # prefill length
STEPS = ("prefill", "decode_1", "decode_2")
BASE_SEED = 20240601

# Shared tiny geometry.
COMMON = dict(
    vocab_size=128,
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    intermediate_size=128,
    rms_norm_eps=1e-6,
    max_position_embeddings=256,
    hidden_act="silu",
    attention_dropout=0.0,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=None,
)

# Embedding std.  With RMSNorm in front of every sublayer the absolute scale of
# the residual stream barely matters; this value keeps tied-embedding logits
# (hidden_size ** 0.5 * std after the final norm) around O(2-3).
EMBED_STD = 0.3
ROUTER_SCALE = 4.0
# Fail generation if any token's k-th vs (k+1)-th router logit gap is below this.
MIN_ROUTER_GAP = 0.1


def llama_rope_params(head_dim: int) -> dict:
    """Llama-3.2-style rope scaling; checked to actually alter frequencies."""
    params = dict(
        rope_type="llama3",
        rope_theta=500000.0,
        factor=8.0,
        low_freq_factor=1.0,
        high_freq_factor=4.0,
        original_max_position_embeddings=8192,
    )
    return params


def check_llama3_scaling(model) -> str:
    """Compare the model's inv_freq against unscaled rope; fail if identical."""
    cfg = model.config
    rp = cfg.rope_parameters
    hd = cfg.head_dim
    base = rp["rope_theta"]
    plain = 1.0 / (base ** (torch.arange(0, hd, 2, dtype=torch.int64).float() / hd))
    used = model.model.rotary_emb.inv_freq.detach().float().cpu()
    ratio = (plain / used).numpy()
    n_unchanged = int(np.sum(np.isclose(ratio, 1.0, rtol=1e-6)))
    n_full = int(np.sum(np.isclose(ratio, rp["factor"], rtol=1e-6)))
    n_smooth = len(ratio) - n_unchanged - n_full
    if n_unchanged == len(ratio):
        raise SystemExit(
            "llama3 rope scaling changes no frequency for this head_dim; lower "
            "original_max_position_embeddings"
        )
    wavelen = (2 * math.pi / plain).numpy()
    return (
        f"llama3 rope: wavelens={np.round(wavelen, 1).tolist()} "
        f"plain/scaled={np.round(ratio, 4).tolist()} "
        f"(unchanged={n_unchanged}, smoothed={n_smooth}, divided-by-factor={n_full})"
    )


def family_specs():
    """(model_type, config class, model class, config kwargs)."""
    return [
        (
            "llama",
            LlamaConfig,
            LlamaForCausalLM,
            dict(
                COMMON,
                rope_parameters=llama_rope_params(COMMON["head_dim"]),
                tie_word_embeddings=True,
                attention_bias=False,
                mlp_bias=False,
            ),
        ),
        (
            "qwen2",
            Qwen2Config,
            Qwen2ForCausalLM,
            dict(
                COMMON,
                rope_parameters=dict(rope_type="default", rope_theta=1000000.0),
                tie_word_embeddings=True,
                use_sliding_window=False,
                sliding_window=None,
                max_window_layers=COMMON["num_hidden_layers"],
            ),
        ),
        (
            "qwen3",
            Qwen3Config,
            Qwen3ForCausalLM,
            dict(
                COMMON,
                rope_parameters=dict(rope_type="default", rope_theta=1000000.0),
                tie_word_embeddings=False,
                attention_bias=False,
                use_sliding_window=False,
                sliding_window=None,
                max_window_layers=COMMON["num_hidden_layers"],
            ),
        ),
        (
            "qwen3_moe",
            Qwen3MoeConfig,
            Qwen3MoeForCausalLM,
            dict(
                COMMON,
                rope_parameters=dict(rope_type="default", rope_theta=1000000.0),
                tie_word_embeddings=False,
                attention_bias=False,
                use_sliding_window=False,
                sliding_window=None,
                num_experts=4,
                num_experts_per_tok=2,
                moe_intermediate_size=64,
                norm_topk_prob=True,
                decoder_sparse_step=1,
                mlp_only_layers=[],
                output_router_logits=False,
                router_aux_loss_coef=0.001,
            ),
        ),
        (
            "mixtral",
            MixtralConfig,
            MixtralForCausalLM,
            dict(
                COMMON,
                rope_parameters=dict(rope_type="default", rope_theta=1000000.0),
                tie_word_embeddings=False,
                sliding_window=None,
                num_local_experts=4,
                num_experts_per_tok=2,
                output_router_logits=False,
                router_jitter_noise=0.0,
            ),
        ),
    ]


def family_seed(name: str) -> int:
    # Stable (not Python's salted hash()).
    return BASE_SEED + sum((i + 1) * ord(c) for i, c in enumerate(name))


@torch.no_grad()
def reinit_(model, seed: int) -> None:
    """Deterministic, non-trivial init (overrides HF's std-0.02 init).

    * embeddings: N(0, EMBED_STD)
    * norm weights (incl. qk-norm): 1 + 0.1 * N(0, 1)
    * biases: 0.1 * N(0, 1)
    * matrices / 3D expert stacks: N(0, 1/fan_in), fan_in = last dim
    * MoE router (.gate.weight): ROUTER_SCALE * N(0, 1/fan_in)
    Parameters are visited in sorted-name order with a private generator.
    Tied lm_head shares storage with embed_tokens and is not listed separately.
    """
    gen = torch.Generator().manual_seed(seed)
    for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
        shape = tuple(p.shape)
        noise = torch.randn(shape, generator=gen, dtype=torch.float32)
        if "embed_tokens" in name:
            val = EMBED_STD * noise
        elif name.endswith("norm.weight") or "layernorm" in name:
            val = 1.0 + 0.1 * noise
        elif name.endswith(".bias"):
            val = 0.1 * noise
        elif name.endswith(".gate.weight"):
            # MoE router: ROUTER_SCALE x the usual scale, so the top-k choice has
            # clear logit margins (robust to bf16 compute in the kernel under test).
            val = ROUTER_SCALE * noise / math.sqrt(shape[-1])
        elif p.dim() >= 2:
            val = noise / math.sqrt(shape[-1])
        else:
            raise RuntimeError(f"unhandled parameter {name} {shape}")
        p.copy_(val.to(p.dtype))


def run_reference(model, prefill, d1, d2, on_step=None):
    """Prefill then two cached decode steps; returns three float32 arrays.

    on_step(step_name, cache), if given, is called after each of the three calls
    (step_name in STEPS) while the cache holds that call's state."""
    # transformers >= 5.2x renamed past_key_values -> cache (same DynamicCache
    # object, positions continue from the cache length); support both.
    new_api = "cache" in inspect.signature(model.forward).parameters
    kw = "cache" if new_api else "past_key_values"

    def step(ids, cache):
        extra = {} if cache is None else {kw: cache}
        out = model(input_ids=ids, use_cache=True, **extra)
        return out, getattr(out, kw)

    out0, kv = step(prefill, None)
    if on_step:
        on_step(STEPS[0], kv)
    out1, kv = step(d1, kv)
    if on_step:
        on_step(STEPS[1], kv)
    out2, kv = step(d2, kv)
    if on_step:
        on_step(STEPS[2], kv)
    assert kv.get_seq_length() == T0 + 2, kv.get_seq_length()
    return (
        out0.logits.float().numpy(),
        out1.logits.float().numpy(),
        out2.logits.float().numpy(),
    )


class RoutingCounter:
    """Forward hooks counting how many tokens pick each expert, per layer."""

    def __init__(self, model, n_experts: int, attr: str = "gate"):
        self.counts = {}
        self.min_gap = {}
        self.handles = []
        for li, layer in enumerate(model.model.layers):
            gate = getattr(layer.mlp, attr, None)
            if gate is None or not hasattr(gate, "top_k"):
                continue
            self.counts[li] = np.zeros(n_experts, dtype=np.int64)
            self.handles.append(gate.register_forward_hook(self._hook(li)))

    def _hook(self, li):
        def fn(_mod, _inp, out):
            logits, idx = out[0], out[2]  # (tokens, E), (tokens, top_k)
            self.counts[li] += np.bincount(idx.reshape(-1).numpy(), minlength=len(self.counts[li]))
            # Gap between the k-th and (k+1)-th router logit: small gaps would make
            # expert selection fragile under bf16 compute in the kernel under test.
            srt = torch.sort(logits.float(), dim=-1, descending=True).values
            gap = float((srt[:, idx.shape[-1] - 1] - srt[:, idx.shape[-1]]).min())
            self.min_gap[li] = min(self.min_gap.get(li, math.inf), gap)

        return fn

    def remove(self):
        for h in self.handles:
            h.remove()


def load_fp32(path: Path):
    model = AutoModelForCausalLM.from_pretrained(
        str(path), dtype=torch.float32, attn_implementation="eager"
    )
    model.eval()
    return model


class RoutingTooFragile(Exception):
    pass


def make_family(name, cfg_cls, model_cls, kwargs, out_root: Path, max_attempts: int = 20) -> None:
    """Generate one family; for MoE, deterministically bump the seed until the
    router margins are comfortable and every expert is used."""
    for attempt in range(max_attempts):
        seed = family_seed(name) + 1000 * attempt
        try:
            make_family_once(name, cfg_cls, model_cls, kwargs, out_root, seed)
            return
        except RoutingTooFragile as e:
            print(f"   rejected seed {seed}: {e}; retrying")
            shutil.rmtree(out_root / f".{name}.tmp", ignore_errors=True)
    raise SystemExit(f"{name}: no acceptable seed in {max_attempts} attempts")


def make_family_once(name, cfg_cls, model_cls, kwargs, out_root: Path, seed: int) -> None:
    torch.manual_seed(seed)
    cfg = cfg_cls(**kwargs)
    cfg._attn_implementation = "eager"
    model = model_cls(cfg)
    model.eval()
    reinit_(model, seed)
    assert model.config.model_type == name, (model.config.model_type, name)

    # Build in a scratch folder; it replaces tests/fixtures/hf/<name> only once
    # the whole family passed every check (an interrupted run leaves the old one).
    final_dir = out_root / name
    out_dir = out_root / f".{name}.tmp"
    if out_dir.exists():
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True)

    # Save bf16 weights.
    model = model.to(torch.bfloat16)
    model.save_pretrained(str(out_dir), safe_serialization=True)
    # Keep only the two files the fixture contract names.
    for extra in out_dir.iterdir():
        if extra.name not in ("config.json", "model.safetensors"):
            extra.unlink()
    del model

    # Reload the bf16 checkpoint as float32: weights are exactly the bf16 values,
    # rotary inv_freq is recomputed in float32 from the config.
    ref = load_fp32(out_dir)
    for pname, p in ref.named_parameters():
        assert p.dtype == torch.float32, pname
        assert torch.equal(p, p.to(torch.bfloat16).float()), f"{pname} not bf16-exact"

    gen = torch.Generator().manual_seed(seed + 1)
    V = cfg.vocab_size
    prefill = torch.randint(0, V, (B, T0), generator=gen)
    d1 = torch.randint(0, V, (B, 1), generator=gen)
    d2 = torch.randint(0, V, (B, 1), generator=gen)

    n_exp = getattr(cfg, "num_experts", None) or getattr(cfg, "num_local_experts", None)
    counter = RoutingCounter(ref, n_exp) if n_exp else None
    with torch.no_grad():
        lp, l1, l2 = run_reference(ref, prefill, d1, d2)
        # Self-check: cached decode == full-sequence recompute.
        full = torch.cat([prefill, d1, d2], dim=1)
        if counter:
            counter.remove()
        lf = ref(input_ids=full, use_cache=False).logits.float().numpy()
    err_cache = max(
        np.abs(lf[:, :T0] - lp).max(),
        np.abs(lf[:, T0 : T0 + 1] - l1).max(),
        np.abs(lf[:, T0 + 1 :] - l2).max(),
    )
    assert err_cache < 1e-4, f"{name}: cached decode vs recompute diff {err_cache}"

    np.savez(
        out_dir / "expected.npz",
        prefill_ids=prefill.numpy().astype(np.int32),
        decode_ids_1=d1.numpy().astype(np.int32),
        decode_ids_2=d2.numpy().astype(np.int32),
        logits_prefill=lp.astype(np.float32),
        logits_decode_1=l1.astype(np.float32),
        logits_decode_2=l2.astype(np.float32),
    )

    # Summary.
    probs = torch.softmax(torch.from_numpy(lp), -1)
    size_kb = sum(f.stat().st_size for f in out_dir.iterdir()) / 1024
    print(f"== {name} ({type(ref).__name__}) seed={seed} dir={final_dir}")
    print(
        f"   params={sum(p.numel() for p in ref.parameters())} files={size_kb:.1f} KiB "
        f"tie_word_embeddings={ref.config.tie_word_embeddings}"
    )
    print(f"   prefill_ids={prefill.tolist()} decode_1={d1.flatten().tolist()} decode_2={d2.flatten().tolist()}")
    print(
        f"   logits_prefill: std={lp.std():.3f} absmax={np.abs(lp).max():.3f} "
        f"max-softmax-prob mean={probs.max(-1).values.mean():.3f}; "
        f"decode_1 std={l1.std():.3f}; decode_2 std={l2.std():.3f}; "
        f"cache-vs-recompute maxdiff={err_cache:.2e}"
    )
    if name == "llama":
        print("   " + check_llama3_scaling(ref))
    if counter:
        for li, c in counter.counts.items():
            print(
                f"   layer {li} expert routing counts (prefill+2 decodes, top-k slots): {c.tolist()}; "
                f"min top-k/next router-logit gap={counter.min_gap[li]:.4f}"
            )
            if counter.min_gap[li] < MIN_ROUTER_GAP:
                raise RoutingTooFragile(f"layer {li} router margin {counter.min_gap[li]:.4f} < {MIN_ROUTER_GAP}")
            if (c == 0).any():
                raise RoutingTooFragile(f"layer {li} router never picks some expert: {c.tolist()}")

    if final_dir.exists():
        shutil.rmtree(final_dir)
    out_dir.rename(final_dir)


# ---------------------------------------------------------------------------
# Wave 2: hybrid linear attention (Gated DeltaNet), MLA + group-limited sigmoid
# routing, sliding windows, soft-capping, sinks, fused projections.
#
# Same contract as above (bf16 checkpoint, float32 eager logits from the reloaded
# checkpoint, HF cache reused across the decode steps), plus:
#   * every parameter that HF initialises to a constant (A_log, dt_bias, the
#     (1+w) norms, the gated norm, sinks, the routing correction bias) is drawn
#     at random, so a reference that drops any term fails;
#   * Gated DeltaNet fixtures also store HF's conv and recurrent cache states
#     after each step (float32, HF layout);
#   * "ablations": the generator reloads the checkpoint with one config term
#     switched off and fails unless the logits move by more than ABLATION_MIN,
#     which shows the term is visible at the parity tolerance.
# ---------------------------------------------------------------------------

# RMSNorm classes that scale by (1 + w) (weight zero-initialised by HF).
ZERO_CENTRED_NORMS = {"Qwen3_5RMSNorm", "Qwen3NextRMSNorm", "Gemma2RMSNorm", "Gemma3RMSNorm"}
ROUTER_CLASSES = {"Qwen3NextTopKRouter", "DeepseekV3TopkRouter", "GptOssTopKRouter"}
# Sigmoid routers (DeepSeek): minimum gap between the chosen and the next
# candidate, in units of biased sigmoid score, for experts and for groups.
MIN_SIGMOID_GAP = 0.005
# An ablated term must move some logit by more than this (parity tolerance is
# 1e-4 of the logit scale, which is O(1) here).
ABLATION_MIN = 1e-2
E_BIAS_STD = 0.1

COMMON2 = dict(
    vocab_size=128,
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    intermediate_size=128,
    rms_norm_eps=1e-6,
    max_position_embeddings=256,
    attention_dropout=0.0,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=None,
)


def _without(d: dict, *keys) -> dict:
    return {k: v for k, v in d.items() if k not in keys}


@dataclass
class Wave2Spec:
    name: str  # folder under tests/fixtures/hf
    model_type: str  # what the saved config.json says
    cfg_cls: type
    model_cls: type
    kwargs: dict
    router: str | None = None  # None, "softmax" (mlp.gate), "gpt_oss" (mlp.router), "deepseek"
    router_scale: float = ROUTER_SCALE
    linear_state: bool = False  # store GDN conv/recurrent states
    # (label, function(config) -> None) pairs; each must move the logits.
    ablations: list = field(default_factory=list)


def _set(**kw):
    def fn(cfg):
        for k, v in kw.items():
            setattr(cfg, k, v)

    return fn


def _set_rope(**kw):
    def fn(cfg):
        cfg.rope_parameters = dict(cfg.rope_parameters, **kw)

    return fn


def _gdn_kwargs(**extra) -> dict:
    return dict(
        _without(COMMON2, "num_hidden_layers", "head_dim"),
        num_hidden_layers=4,
        layer_types=["linear_attention"] * 3 + ["full_attention"],
        head_dim=32,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        linear_conv_kernel_dim=4,
        hidden_act="silu",
        tie_word_embeddings=False,
        attention_bias=False,
        **extra,
    )


def _deepseek_kwargs(**extra) -> dict:
    return dict(
        _without(COMMON2, "num_key_value_heads", "head_dim"),
        num_key_value_heads=4,  # MLA: HF repeats nothing; must equal the head count
        q_lora_rank=32,
        kv_lora_rank=32,
        qk_nope_head_dim=16,
        qk_rope_head_dim=8,
        v_head_dim=16,
        moe_intermediate_size=32,
        n_routed_experts=8,
        num_experts_per_tok=2,
        n_shared_experts=1,
        routed_scaling_factor=2.5,
        first_k_dense_replace=1,
        norm_topk_prob=True,
        hidden_act="silu",
        tie_word_embeddings=False,
        attention_bias=False,
        num_mtp_layers=0,
    ) | extra


def wave2_specs():
    return [
        Wave2Spec(
            "qwen3_5",
            "qwen3_5_text",
            Qwen3_5TextConfig,
            Qwen3_5ForCausalLM,
            _gdn_kwargs(
                rope_parameters=dict(
                    rope_type="default",
                    rope_theta=10000000.0,
                    partial_rotary_factor=0.25,
                    mrope_section=[2, 1, 1],
                    mrope_interleaved=True,
                ),
                attn_output_gate=True,
            ),
            linear_state=True,
        ),
        Wave2Spec(
            "qwen3_next",
            "qwen3_next",
            Qwen3NextConfig,
            Qwen3NextForCausalLM,
            _gdn_kwargs(
                rope_parameters=dict(rope_type="default", rope_theta=10000000.0, partial_rotary_factor=0.25),
                num_experts=4,
                num_experts_per_tok=2,
                moe_intermediate_size=32,
                shared_expert_intermediate_size=64,
                norm_topk_prob=True,
                decoder_sparse_step=1,
                mlp_only_layers=[],
                output_router_logits=False,
                router_aux_loss_coef=0.001,
            ),
            router="softmax",
            linear_state=True,
        ),
        Wave2Spec(
            "deepseek_v3",
            "deepseek_v3",
            DeepseekV3Config,
            DeepseekV3ForCausalLM,
            _deepseek_kwargs(
                n_group=2,
                topk_group=1,
                max_position_embeddings=163840,
                rope_parameters=dict(
                    rope_type="yarn",
                    rope_theta=10000.0,
                    factor=40.0,
                    beta_fast=32.0,
                    beta_slow=1.0,
                    mscale=1.0,
                    mscale_all_dim=0.8,
                    original_max_position_embeddings=4096,
                ),
            ),
            router="deepseek",
            router_scale=2.0,
            ablations=[
                ("rope_interleave=False", _set(rope_interleave=False)),
                ("topk_group=n_group (no group limit)", _set(topk_group=2)),
                ("routed_scaling_factor=1", _set(routed_scaling_factor=1.0)),
                ("mscale_all_dim=mscale", _set_rope(mscale_all_dim=1.0)),
            ],
        ),
        Wave2Spec(
            "deepseek_v3_nolora",
            "deepseek_v3",
            DeepseekV3Config,
            DeepseekV3ForCausalLM,
            _deepseek_kwargs(
                q_lora_rank=None,
                n_group=1,
                topk_group=1,
                rope_parameters=dict(rope_type="default", rope_theta=10000.0),
            ),
            router="deepseek",
            router_scale=2.0,
            ablations=[("rope_interleave=False", _set(rope_interleave=False))],
        ),
        Wave2Spec(
            "mistral",
            "mistral",
            MistralConfig,
            MistralForCausalLM,
            dict(
                COMMON2,
                hidden_act="silu",
                rope_parameters=dict(rope_type="default", rope_theta=10000.0),
                sliding_window=4,
                tie_word_embeddings=False,
            ),
            ablations=[("sliding_window=None", _set(sliding_window=None))],
        ),
        Wave2Spec(
            "gemma2",
            "gemma2",
            Gemma2Config,
            Gemma2ForCausalLM,
            dict(
                COMMON2,
                hidden_activation="gelu_pytorch_tanh",
                rope_parameters=dict(rope_type="default", rope_theta=10000.0),
                query_pre_attn_scalar=24,
                sliding_window=4,
                layer_types=["sliding_attention", "full_attention"],
                attn_logit_softcapping=5.0,
                final_logit_softcapping=4.0,
                tie_word_embeddings=True,
                attention_bias=False,
            ),
            ablations=[
                ("sliding_window=64", _set(sliding_window=64)),
                ("attn_logit_softcapping=None", _set(attn_logit_softcapping=None)),
                ("final_logit_softcapping=None", _set(final_logit_softcapping=None)),
                ("query_pre_attn_scalar=head_dim", _set(query_pre_attn_scalar=16)),
            ],
        ),
        Wave2Spec(
            "gemma3_text",
            "gemma3_text",
            Gemma3TextConfig,
            Gemma3ForCausalLM,
            dict(
                _without(COMMON2, "num_hidden_layers"),
                num_hidden_layers=6,
                hidden_activation="gelu_pytorch_tanh",
                rope_parameters={
                    "sliding_attention": dict(rope_type="default", rope_theta=10000.0),
                    "full_attention": dict(rope_type="linear", rope_theta=1000000.0, factor=8.0),
                },
                query_pre_attn_scalar=24,
                sliding_window=4,
                layer_types=["sliding_attention"] * 5 + ["full_attention"],
                final_logit_softcapping=None,
                attn_logit_softcapping=None,
                tie_word_embeddings=True,
                attention_bias=False,
            ),
            ablations=[
                ("sliding_window=64", _set(sliding_window=64)),
                ("query_pre_attn_scalar=head_dim", _set(query_pre_attn_scalar=16)),
                (
                    "local rope theta = global",
                    lambda c: c.rope_parameters.__setitem__(
                        "sliding_attention", dict(rope_type="default", rope_theta=1000000.0)
                    ),
                ),
            ],
        ),
        Wave2Spec(
            "olmo2",
            "olmo2",
            Olmo2Config,
            Olmo2ForCausalLM,
            dict(
                _without(COMMON2, "head_dim"),
                hidden_act="silu",
                rope_parameters=dict(rope_type="default", rope_theta=500000.0),
                tie_word_embeddings=False,
                attention_bias=False,
            ),
        ),
        Wave2Spec(
            "gpt_oss",
            "gpt_oss",
            GptOssConfig,
            GptOssForCausalLM,
            dict(
                COMMON2,
                rms_norm_eps=1e-5,
                max_position_embeddings=131072,
                intermediate_size=96,  # != hidden, so [E, in, out] vs [E, out, in] shows in the shapes
                num_local_experts=4,
                num_experts_per_tok=2,
                sliding_window=4,
                layer_types=["sliding_attention", "full_attention"],
                attention_bias=True,
                swiglu_limit=1.5,
                tie_word_embeddings=False,
                output_router_logits=False,
                rope_parameters=dict(
                    rope_type="yarn",
                    rope_theta=150000.0,
                    factor=32.0,
                    beta_fast=32.0,
                    beta_slow=1.0,
                    truncate=False,
                    original_max_position_embeddings=4096,
                ),
            ),
            router="gpt_oss",
            ablations=[
                ("sliding_window=64", _set(sliding_window=64)),
                ("swiglu_limit=7", _set(swiglu_limit=7.0)),
            ],
        ),
        Wave2Spec(
            "phi3",
            "phi3",
            Phi3Config,
            Phi3ForCausalLM,
            dict(
                _without(COMMON2, "head_dim"),
                rms_norm_eps=1e-5,
                hidden_act="silu",
                rope_parameters=dict(rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.75),
                original_max_position_embeddings=256,
                sliding_window=None,
                tie_word_embeddings=True,
                resid_pdrop=0.0,
                embd_pdrop=0.0,
            ),
            ablations=[("partial_rotary_factor=1", _set_rope(partial_rotary_factor=1.0))],
        ),
    ]


def _param_owners(model) -> dict:
    owners = {}
    for mname, mod in model.named_modules():
        for pname, _ in mod.named_parameters(recurse=False):
            owners[f"{mname}.{pname}" if mname else pname] = type(mod).__name__
        for bname, _ in mod.named_buffers(recurse=False):
            owners[f"{mname}.{bname}" if mname else bname] = type(mod).__name__
    return owners


@torch.no_grad()
def reinit_wave2_(model, seed: int, spec: Wave2Spec) -> None:
    """Deterministic, non-trivial init for the wave-2 families.

    As reinit_() (embeddings N(0, EMBED_STD), matrices N(0, 1/fan_in), biases
    0.1 N(0, 1), routers spec.router_scale / sqrt(fan_in)), plus:
    * plain-w RMSNorms (incl. the GDN gated norm, MLA q_a/kv_a norms): 1 + 0.1 N
    * (1+w) RMSNorms (Qwen3.5/Next, Gemma2/3): w = 0.1 N, so the scale is 1 + 0.1 N
    * GDN A_log: -1 + 0.5 N; dt_bias: 0.5 N (decays exp(g) mostly in 0.4-0.95)
    * gpt-oss sinks: N(0, 1); router bias: 0.5 N
    * DeepSeek e_score_correction_bias (a buffer): E_BIAS_STD N
    * gpt-oss expert stacks are [E, in, out]: fan_in is dim 1
    Parameters (and that buffer) are visited in sorted-name order.
    """
    gen = torch.Generator().manual_seed(seed)
    owners = _param_owners(model)
    tensors = dict(model.named_parameters())
    tensors.update({n: b for n, b in model.named_buffers() if n.endswith("e_score_correction_bias")})
    for name in sorted(tensors):
        p = tensors[name]
        shape = tuple(p.shape)
        noise = torch.randn(shape, generator=gen, dtype=torch.float32)
        leaf = name.rsplit(".", 1)[-1]
        cls = owners.get(name, "")
        if "embed_tokens" in name:
            val = EMBED_STD * noise
        elif cls in ZERO_CENTRED_NORMS:
            val = 0.1 * noise
        elif "RMSNorm" in cls:
            val = 1.0 + 0.1 * noise
        elif leaf == "A_log":
            val = -1.0 + 0.5 * noise
        elif leaf == "dt_bias":
            val = 0.5 * noise
        elif leaf == "sinks":
            val = noise
        elif leaf == "e_score_correction_bias":
            val = E_BIAS_STD * noise
        elif cls in ROUTER_CLASSES and leaf == "weight":
            val = spec.router_scale * noise / math.sqrt(shape[-1])
        elif cls in ROUTER_CLASSES and leaf == "bias":
            val = 0.5 * noise
        elif leaf.endswith("bias"):
            val = 0.1 * noise
        elif cls == "GptOssExperts" and p.dim() == 3:
            val = noise / math.sqrt(shape[1])
        elif p.dim() >= 2:
            val = noise / math.sqrt(shape[-1])
        else:
            raise RuntimeError(f"unhandled parameter {name} {shape} ({cls})")
        p.copy_(val.to(p.dtype))


class DeepseekRoutingCheck:
    """Recomputes DeepSeek-V3's noaux_tc routing from the router's input and
    checks it is stable and that both the bias and the group limit change some
    token's choice (so a reference that skips either fails)."""

    def __init__(self, model):
        self.handles, self.stats = [], {}
        for li, layer in enumerate(model.model.layers):
            gate = getattr(layer.mlp, "gate", None)
            if type(gate).__name__ == "DeepseekV3TopkRouter":
                self.stats[li] = dict(
                    counts=np.zeros(gate.num_experts, dtype=np.int64),
                    expert_gap=math.inf,
                    group_gap=math.inf,
                    by_bias=0,
                    by_group=0,
                    tokens=0,
                )
                self.handles.append(gate.register_forward_hook(self._hook(li)))

    def _hook(self, li):
        def fn(mod, inp, out):
            st = self.stats[li]
            idx = out[2]
            x = inp[0].reshape(-1, mod.hidden_dim).float()
            s = torch.sigmoid(x @ mod.weight.float().t())
            b = s + mod.e_score_correction_bias.float()
            E, G, K, KG = mod.num_experts, mod.num_group, mod.top_k, mod.topk_group

            def select(sc):
                gs = sc.view(-1, G, E // G).topk(2, dim=-1)[0].sum(-1)
                keep = torch.zeros_like(gs).scatter_(1, gs.topk(KG, dim=-1)[1], 1.0)
                mask = keep.unsqueeze(-1).expand(-1, G, E // G).reshape(-1, E).bool()
                masked = sc.masked_fill(~mask, float("-inf"))
                return gs, masked, masked.topk(K, dim=-1)[1]

            gs, masked, sel = select(b)
            assert all(set(a.tolist()) == set(c.tolist()) for a, c in zip(sel, idx)), "routing recompute differs"
            st["counts"] += np.bincount(idx.reshape(-1).numpy(), minlength=E)
            srt = masked.sort(dim=-1, descending=True).values
            st["expert_gap"] = min(st["expert_gap"], float((srt[:, K - 1] - srt[:, K]).min()))
            if KG < G:
                gsrt = gs.sort(dim=-1, descending=True).values
                st["group_gap"] = min(st["group_gap"], float((gsrt[:, KG - 1] - gsrt[:, KG]).min()))
            _, _, sel_nobias = select(s)
            sel_nogroup = b.topk(K, dim=-1)[1]
            for a, nb, ng in zip(idx, sel_nobias, sel_nogroup):
                st["by_bias"] += set(a.tolist()) != set(nb.tolist())
                st["by_group"] += set(a.tolist()) != set(ng.tolist())
            st["tokens"] += idx.shape[0]

        return fn

    def remove(self):
        for h in self.handles:
            h.remove()

    def report_and_check(self, n_group: int, topk_group: int):
        for li, st in self.stats.items():
            print(
                f"   layer {li} deepseek routing: counts={st['counts'].tolist()} "
                f"min expert gap={st['expert_gap']:.4f} min group gap={st['group_gap']:.4f} "
                f"tokens whose choice the bias changes={st['by_bias']}/{st['tokens']}, "
                f"the group limit changes={st['by_group']}/{st['tokens']}"
            )
            if (st["counts"] == 0).any():
                raise RoutingTooFragile(f"layer {li} router never picks some expert: {st['counts'].tolist()}")
            if st["expert_gap"] < MIN_SIGMOID_GAP or st["group_gap"] < MIN_SIGMOID_GAP:
                raise RoutingTooFragile(f"layer {li} sigmoid routing margin below {MIN_SIGMOID_GAP}")
            if st["by_bias"] == 0:
                raise RoutingTooFragile(f"layer {li}: the correction bias changes no token's experts")
            if topk_group < n_group and st["by_group"] == 0:
                raise RoutingTooFragile(f"layer {li}: the group limit changes no token's experts")


def linear_layers(cfg) -> list:
    return [i for i, t in enumerate(getattr(cfg, "layer_types", None) or []) if t == "linear_attention"]


class StateRecorder:
    """Copies HF's GDN cache states (conv + recurrent, float32) after each step."""

    def __init__(self, cfg):
        self.layers = linear_layers(cfg)
        self.arrays = {}

    def __call__(self, step, cache):
        for i in self.layers:
            layer = cache.layers[i]
            self.arrays[f"conv_state_{i}_{step}"] = layer.conv_states[0].detach().float().numpy().copy()
            self.arrays[f"recurrent_state_{i}_{step}"] = layer.recurrent_states[0].detach().float().numpy().copy()


def ablation_diff(model_dir: Path, mutate, full_ids, lf) -> float:
    cfg = AutoConfig.from_pretrained(str(model_dir))
    mutate(cfg)
    model = AutoModelForCausalLM.from_pretrained(
        str(model_dir), config=cfg, dtype=torch.float32, attn_implementation="eager"
    )
    model.eval()
    with torch.no_grad():
        la = model(input_ids=full_ids, use_cache=False).logits.float().numpy()
    return float(np.abs(la - lf).max())


def assert_torch_paths() -> None:
    """transformers silently swaps in fla / causal-conv1d kernels when they are
    importable; the fixtures must come from its pure-torch path."""
    import importlib.util

    found = [m for m in ("fla", "causal_conv1d") if importlib.util.find_spec(m) is not None]
    if found:
        raise SystemExit(f"{found} importable in this venv: remove them (the fixtures use HF's torch path)")


def make_wave2(spec: Wave2Spec, out_root: Path, max_attempts: int = 50) -> None:
    assert_torch_paths()
    for attempt in range(max_attempts):
        seed = family_seed(spec.name) + 1000 * attempt
        try:
            make_wave2_once(spec, out_root, seed)
            return
        except RoutingTooFragile as e:
            print(f"   rejected seed {seed}: {e}; retrying")
            shutil.rmtree(out_root / f".{spec.name}.tmp", ignore_errors=True)
    raise SystemExit(f"{spec.name}: no acceptable seed in {max_attempts} attempts")


def make_wave2_once(spec: Wave2Spec, out_root: Path, seed: int) -> None:
    name = spec.name
    torch.manual_seed(seed)
    cfg = spec.cfg_cls(**spec.kwargs)
    cfg._attn_implementation = "eager"
    model = spec.model_cls(cfg)
    model.eval()
    reinit_wave2_(model, seed, spec)
    assert model.config.model_type == spec.model_type, (model.config.model_type, spec.model_type)

    final_dir = out_root / name
    out_dir = out_root / f".{name}.tmp"
    if out_dir.exists():
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True)

    model = model.to(torch.bfloat16)
    model.save_pretrained(str(out_dir), safe_serialization=True)
    for extra in out_dir.iterdir():
        if extra.name not in ("config.json", "model.safetensors"):
            extra.unlink()
    del model

    ref = load_fp32(out_dir)
    assert type(ref).__name__ == spec.model_cls.__name__, type(ref).__name__
    for pname, p in list(ref.named_parameters()) + list(ref.named_buffers()):
        if not p.is_floating_point() or "inv_freq" in pname or "embed_scale" in pname:
            continue
        assert p.dtype == torch.float32, pname
        assert torch.equal(p, p.to(torch.bfloat16).float()), f"{pname} not bf16-exact"

    gen = torch.Generator().manual_seed(seed + 1)
    V = cfg.vocab_size
    prefill = torch.randint(0, V, (B, T0), generator=gen)
    d1 = torch.randint(0, V, (B, 1), generator=gen)
    d2 = torch.randint(0, V, (B, 1), generator=gen)
    full = torch.cat([prefill, d1, d2], dim=1)

    counter = deepseek = None
    if spec.router in ("softmax", "gpt_oss"):
        n_exp = getattr(cfg, "num_experts", None) or getattr(cfg, "num_local_experts", None)
        counter = RoutingCounter(ref, n_exp, attr="router" if spec.router == "gpt_oss" else "gate")
    elif spec.router == "deepseek":
        deepseek = DeepseekRoutingCheck(ref)
    states = StateRecorder(ref.config) if spec.linear_state else None

    with torch.no_grad():
        lp, l1, l2 = run_reference(ref, prefill, d1, d2, on_step=states)
        for h in (counter, deepseek):
            if h:
                h.remove()
        lf = ref(input_ids=full, use_cache=False).logits.float().numpy()
        err_state = 0.0
        if states:
            # The chunked prefill form over all 7 tokens must land on the state
            # the recurrent decode form reached after decode_2.
            one_shot = StateRecorder(ref.config)
            out = ref(input_ids=full, use_cache=True)
            one_shot("full", out.cache if hasattr(out, "cache") else out.past_key_values)
            for i in states.layers:
                for kind in ("conv_state", "recurrent_state"):
                    a = states.arrays[f"{kind}_{i}_decode_2"]
                    b = one_shot.arrays[f"{kind}_{i}_full"]
                    err_state = max(err_state, float(np.abs(a - b).max()))
            assert err_state < 1e-4, f"{name}: decode state vs one-shot state diff {err_state}"
    err_cache = max(
        np.abs(lf[:, :T0] - lp).max(),
        np.abs(lf[:, T0 : T0 + 1] - l1).max(),
        np.abs(lf[:, T0 + 1 :] - l2).max(),
    )
    assert err_cache < 1e-4, f"{name}: cached decode vs recompute diff {err_cache}"

    arrays = dict(
        prefill_ids=prefill.numpy().astype(np.int32),
        decode_ids_1=d1.numpy().astype(np.int32),
        decode_ids_2=d2.numpy().astype(np.int32),
        logits_prefill=lp.astype(np.float32),
        logits_decode_1=l1.astype(np.float32),
        logits_decode_2=l2.astype(np.float32),
    )
    if states:
        arrays.update({k: v.astype(np.float32) for k, v in states.arrays.items()})
    np.savez(out_dir / "expected.npz", **arrays)

    probs = torch.softmax(torch.from_numpy(lp), -1)
    size_kb = sum(f.stat().st_size for f in out_dir.iterdir()) / 1024
    print(f"== {name} ({type(ref).__name__}, model_type {ref.config.model_type}) seed={seed} dir={final_dir}")
    print(
        f"   params={sum(p.numel() for p in ref.parameters())} files={size_kb:.1f} KiB "
        f"tie_word_embeddings={ref.config.tie_word_embeddings}"
    )
    print(f"   prefill_ids={prefill.tolist()} decode_1={d1.flatten().tolist()} decode_2={d2.flatten().tolist()}")
    print(
        f"   logits_prefill: std={lp.std():.3f} absmax={np.abs(lp).max():.3f} "
        f"max-softmax-prob mean={probs.max(-1).values.mean():.3f}; "
        f"decode_1 std={l1.std():.3f}; decode_2 std={l2.std():.3f}; "
        f"cache-vs-recompute maxdiff={err_cache:.2e}"
        + (f"; decode-vs-one-shot state maxdiff={err_state:.2e}" if states else "")
    )
    if states:
        for i in states.layers:
            cs = states.arrays[f"conv_state_{i}_decode_2"]
            rs = states.arrays[f"recurrent_state_{i}_decode_2"]
            print(f"   layer {i} states: conv {list(cs.shape)} |x|max={np.abs(cs).max():.3f}; "
                  f"recurrent {list(rs.shape)} |S|max={np.abs(rs).max():.3f}")
    if counter:
        for li, c in counter.counts.items():
            print(
                f"   layer {li} expert routing counts (prefill+2 decodes, top-k slots): {c.tolist()}; "
                f"min top-k/next router-logit gap={counter.min_gap[li]:.4f}"
            )
            if counter.min_gap[li] < MIN_ROUTER_GAP:
                raise RoutingTooFragile(f"layer {li} router margin {counter.min_gap[li]:.4f} < {MIN_ROUTER_GAP}")
            if (c == 0).any():
                raise RoutingTooFragile(f"layer {li} router never picks some expert: {c.tolist()}")
    if deepseek:
        deepseek.report_and_check(cfg.n_group, cfg.topk_group)
    for label, mutate in spec.ablations:
        d = ablation_diff(out_dir, mutate, full, lf)
        print(f"   ablation {label}: logits move by {d:.4f}")
        assert d > ABLATION_MIN, f"{name}: ablating {label} moves the logits only by {d}"

    if final_dir.exists():
        shutil.rmtree(final_dir)
    out_dir.rename(final_dir)


def all_family_names():
    return [name for name, *_ in family_specs()] + [s.name for s in wave2_specs()]


def verify(out_root: Path, only) -> int:
    """Reload each fixture with transformers and re-run prefill + decodes
    (and, for Gated DeltaNet fixtures, re-check the stored cache states)."""
    bad = 0
    for name in all_family_names():
        if only and name not in only:
            continue
        d = out_root / name
        exp = np.load(d / "expected.npz")
        model = load_fp32(d)
        if linear_layers(model.config):
            assert_torch_paths()
        states = StateRecorder(model.config) if linear_layers(model.config) else None
        with torch.no_grad():
            lp, l1, l2 = run_reference(
                model,
                torch.from_numpy(exp["prefill_ids"]).long(),
                torch.from_numpy(exp["decode_ids_1"]).long(),
                torch.from_numpy(exp["decode_ids_2"]).long(),
                on_step=states,
            )
        errs = [
            float(np.abs(lp - exp["logits_prefill"]).max()),
            float(np.abs(l1 - exp["logits_decode_1"]).max()),
            float(np.abs(l2 - exp["logits_decode_2"]).max()),
        ]
        extra = ""
        if states:
            assert set(states.arrays) | set(exp.files) == set(exp.files), "missing state arrays"
            serr = max(float(np.abs(v - exp[k]).max()) for k, v in states.arrays.items())
            errs.append(serr)
            extra = f" (+ {len(states.arrays)} state arrays, maxdiff {serr:.2e})"
        ok = max(errs) < 1e-5
        bad += not ok
        print(f"verify {name}: maxdiff prefill/decode1/decode2 = {errs[:3]}{extra} {'OK' if ok else 'FAIL'}")
    return 1 if bad else 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--only", nargs="*", default=None)
    ap.add_argument("--verify", action="store_true", help="only reload and recheck existing fixtures")
    args = ap.parse_args(argv)

    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, numpy {np.__version__}")

    if args.verify:
        return verify(args.out, args.only)

    args.out = args.out.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.only:
        unknown = set(args.only) - set(all_family_names())
        if unknown:
            raise SystemExit(f"unknown families {sorted(unknown)}; known: {all_family_names()}")
    for name, cfg_cls, model_cls, kwargs in family_specs():
        if args.only and name not in args.only:
            continue
        make_family(name, cfg_cls, model_cls, kwargs, args.out)
    for spec in wave2_specs():
        if args.only and spec.name not in args.only:
            continue
        make_wave2(spec, args.out)
    return verify(args.out, args.only)


if __name__ == "__main__":
    sys.exit(main())
