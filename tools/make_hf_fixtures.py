#!/usr/bin/env python3
"""Generate tiny random Hugging Face checkpoints plus reference logits.

These fixtures give the megakernel an *independent* parity check: the expected
logits come from the Hugging Face `transformers` implementation itself, not from
this project's reference code.

Run inside the separate `.venv-hf` virtualenv (torch CPU + transformers); the
normal project venv does not need torch.  Use `make hf-fixtures`.

For every family a folder tests/fixtures/hf/<model_type>/ is written with
  config.json, model.safetensors (bf16 weights, as written by save_pretrained),
  expected.npz (token ids + float32 logits for a prefill and two decode steps).

The expected logits are computed in float32 (eager attention) by a model that
is *reloaded from the saved bf16 checkpoint* with dtype=float32, so they match
exactly what a loader of the fixture files sees.

Usage:
  python tools/make_hf_fixtures.py [--out DIR] [--only FAMILY ...]
  python tools/make_hf_fixtures.py --verify [--out DIR]   # reload + recheck
"""

from __future__ import annotations

import argparse
import inspect
import math
import os
import shutil
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import (  # noqa: E402
    AutoModelForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    MixtralConfig,
    MixtralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
)

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO_ROOT / "tests" / "fixtures" / "hf"

B = 2  # batch
T0 = 5  # prefill length
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


def run_reference(model, prefill, d1, d2):
    """Prefill then two cached decode steps; returns three float32 arrays."""
    # transformers >= 5.2x renamed past_key_values -> cache (same DynamicCache
    # object, positions continue from the cache length); support both.
    new_api = "cache" in inspect.signature(model.forward).parameters
    kw = "cache" if new_api else "past_key_values"

    def step(ids, cache):
        extra = {} if cache is None else {kw: cache}
        out = model(input_ids=ids, use_cache=True, **extra)
        return out, getattr(out, kw)

    out0, kv = step(prefill, None)
    out1, kv = step(d1, kv)
    out2, kv = step(d2, kv)
    assert kv.get_seq_length() == T0 + 2, kv.get_seq_length()
    return (
        out0.logits.float().numpy(),
        out1.logits.float().numpy(),
        out2.logits.float().numpy(),
    )


class RoutingCounter:
    """Forward hooks counting how many tokens pick each expert, per layer."""

    def __init__(self, model, n_experts: int):
        self.counts = {}
        self.min_gap = {}
        self.handles = []
        for li, layer in enumerate(model.model.layers):
            gate = getattr(layer.mlp, "gate", None)
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


def verify(out_root: Path, only) -> int:
    """Reload each fixture with transformers and re-run prefill + decodes."""
    bad = 0
    for name, *_ in family_specs():
        if only and name not in only:
            continue
        d = out_root / name
        exp = np.load(d / "expected.npz")
        model = load_fp32(d)
        with torch.no_grad():
            lp, l1, l2 = run_reference(
                model,
                torch.from_numpy(exp["prefill_ids"]).long(),
                torch.from_numpy(exp["decode_ids_1"]).long(),
                torch.from_numpy(exp["decode_ids_2"]).long(),
            )
        errs = [
            float(np.abs(lp - exp["logits_prefill"]).max()),
            float(np.abs(l1 - exp["logits_decode_1"]).max()),
            float(np.abs(l2 - exp["logits_decode_2"]).max()),
        ]
        ok = max(errs) < 1e-5
        bad += not ok
        print(f"verify {name}: maxdiff prefill/decode1/decode2 = {errs} {'OK' if ok else 'FAIL'}")
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
    for name, cfg_cls, model_cls, kwargs in family_specs():
        if args.only and name not in args.only:
            continue
        make_family(name, cfg_cls, model_cls, kwargs, args.out)
    return verify(args.out, args.only)


if __name__ == "__main__":
    sys.exit(main())
