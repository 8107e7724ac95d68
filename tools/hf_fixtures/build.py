"""Write one fixture folder from its spec: build the model with transformers,
draw its weights, save them in bf16, reload in float32, record the reference
logits (and Gated DeltaNet states), and keep the folder only if every check
passes.

Contract of a fixture (tests/fixtures/hf/README.md): config.json,
model.safetensors (bf16, as save_pretrained writes them) and expected.npz
(token ids and float32 eager logits of a prefill and two cached decode steps,
computed by the model reloaded from the saved bf16 checkpoint; GDN families
also HF's conv and recurrent cache states after each call). Families with
ablations are reloaded with each config term switched off (or, for model
ablations, with a weight set to HF's constant init or a parameter-free op
bypassed) and fail unless the logits move by more than ABLATION_MIN, which
shows the term is visible at the parity tolerance; their ``no_ops`` must move
no logit by more than NO_OP_MAX.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import torch
from transformers import AutoConfig

from .checks import (DeepseekRoutingCheck, MuseSparkRoutingCheck, RoutingCounter, RoutingTooFragile,
                     check_llama3_scaling)
from . import shipped
from .reference import StateRecorder, assert_torch_paths, classes, load_fp32, run_reference
from .spec import (ABLATION_MIN, B, DEEPSEEK_FP8, DERIVED, E_BIAS_STD, EMBED_STD, GPT_OSS_MXFP4,
                   MUSE_SPARK_NVFP4, NO_OP_MAX, QWEN3_NVFP4, RESIDUAL_GATE_STD, ROUTER_CLASSES, T0,
                   ZERO_CENTRED_NORMS, FixtureSpec, family_seed)

SHIPPED = {"mxfp4": GPT_OSS_MXFP4, "fp8": DEEPSEEK_FP8, "nvfp4": QWEN3_NVFP4,
           "nvfp4_experts": MUSE_SPARK_NVFP4}


@torch.no_grad()
def init_by_names_(model, seed: int, spec: FixtureSpec) -> None:
    """Deterministic, non-trivial init (overrides HF's std-0.02 init); the rule
    of the first five families, read from parameter names.

    * embeddings: N(0, EMBED_STD)
    * norm weights (incl. qk-norm): 1 + 0.1 * N(0, 1)
    * biases: 0.1 * N(0, 1)
    * matrices / 3D expert stacks: N(0, 1/fan_in), fan_in = last dim
    * MoE router (.gate.weight): spec.router_scale * N(0, 1/fan_in)
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
            # MoE router: router_scale x the usual scale, so the top-k choice has
            # clear logit margins (robust to bf16 compute in the kernel under test).
            val = spec.router_scale * noise / math.sqrt(shape[-1])
        elif p.dim() >= 2:
            val = noise / math.sqrt(shape[-1])
        else:
            raise RuntimeError(f"unhandled parameter {name} {shape}")
        p.copy_(val.to(p.dtype))


def _param_owners(model) -> dict:
    owners = {}
    for mname, mod in model.named_modules():
        for pname, _ in mod.named_parameters(recurse=False):
            owners[f"{mname}.{pname}" if mname else pname] = type(mod).__name__
        for bname, _ in mod.named_buffers(recurse=False):
            owners[f"{mname}.{bname}" if mname else bname] = type(mod).__name__
    return owners


@torch.no_grad()
def init_by_owners_(model, seed: int, spec: FixtureSpec) -> None:
    """Deterministic, non-trivial init read from the class of each parameter's
    module; every parameter HF initialises to a constant is drawn too, so a
    reference that drops any term fails.

    As init_by_names_ (embeddings N(0, EMBED_STD), matrices N(0, 1/fan_in), biases
    0.1 N(0, 1), routers spec.router_scale / sqrt(fan_in)), plus:
    * plain-w RMSNorms (incl. the GDN gated norm, MLA q_a/kv_a norms): 1 + 0.1 N
    * (1+w) RMSNorms (Qwen3.5/Next, Gemma2/3): w = 0.1 N, so the scale is 1 + 0.1 N
    * GDN A_log: -1 + 0.5 N; dt_bias: 0.5 N (decays exp(g) mostly in 0.4-0.95)
    * gpt-oss sinks: N(0, 1); router bias: 0.5 N
    * DeepSeek e_score_correction_bias (a buffer): E_BIAS_STD N
    * gpt-oss expert stacks are [E, in, out]: fan_in is dim 1
    * Muse Spark residual gates: RESIDUAL_GATE_STD N; LayerNorm (its vision
      tower) weights 1 + 0.1 N, biases 0.1 N
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
        elif cls == "MuseSparkResidualGate":
            val = RESIDUAL_GATE_STD * noise
        elif cls == "LayerNorm" and leaf == "weight":
            val = 1.0 + 0.1 * noise
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


INIT = {"names": init_by_names_, "owners": init_by_owners_}


def ablation_diff(model_dir: Path, mutate, full_ids, lf, target: str = "config") -> float:
    """Largest logit movement when ``mutate`` edits the config (``target``
    "config") or the loaded model ("model") of the fixture at ``model_dir``."""
    if target == "config":
        cfg = AutoConfig.from_pretrained(str(model_dir))
        mutate(cfg)
        model = load_fp32(model_dir, cfg)
    else:
        model = load_fp32(model_dir)
        with torch.no_grad():
            mutate(model)
    with torch.no_grad():
        la = model(input_ids=full_ids, use_cache=False).logits.float().numpy()
    return float(np.abs(la - lf).max())


def _check_sub_configs(spec: FixtureSpec, out_dir: Path) -> None:
    """The saved config.json's sub-configs keep every value the spec gives."""
    saved = json.loads((out_dir / "config.json").read_text())
    for sub, want in spec.sub_configs.items():
        differ = {k: (v, saved[sub].get(k)) for k, v in want.items() if saved[sub].get(k) != v}
        assert not differ, f"{spec.name}: {sub} spec vs config.json: {differ}"


def _check_derived(spec: FixtureSpec, cfg) -> None:
    """The layer pattern the spec gives is the one HF derives without it."""
    text = spec.sub_configs.get("text_config")
    if not text or not any(k in text for k in DERIVED):
        return
    bare = type(cfg.get_text_config())(**{k: v for k, v in text.items() if k not in DERIVED})
    differ = {k: (text[k], getattr(bare, k)) for k in DERIVED
              if k in text and list(text[k]) != list(getattr(bare, k))}
    assert not differ, f"{spec.name}: spec vs HF-derived layer pattern: {differ}"


def _keep_fp32_(model) -> list[str]:
    """The tensors HF keeps in float32 (``_keep_in_fp32_modules_strict``) back to
    float32 after the model went to bf16; their names."""
    keep = getattr(model, "_keep_in_fp32_modules_strict", None) or []
    names = []
    for name, t in [*model.named_parameters(), *model.named_buffers()]:
        if t.is_floating_point() and any(k in name for k in keep):
            t.data = t.data.float()
            names.append(name)
    return names


def make(spec: FixtureSpec, out_root: Path) -> None:
    """Generate one family; where it routes, deterministically bump the seed
    until the router margins are comfortable and every expert is used."""
    assert_torch_paths()
    for attempt in range(spec.attempts):
        seed = family_seed(spec.name) + 1000 * attempt
        try:
            make_once(spec, out_root, seed)
            return
        except RoutingTooFragile as e:
            print(f"   rejected seed {seed}: {e}; retrying")
            shutil.rmtree(out_root / f".{spec.name}.tmp", ignore_errors=True)
    raise SystemExit(f"{spec.name}: no acceptable seed in {spec.attempts} attempts")


def _save_bf16(spec: FixtureSpec, out_dir: Path, seed: int):
    """Build the model at ``seed``, save it in bf16 to ``out_dir`` (then, for a
    ``shipped`` spec, rewrite it in that layout); (its config, {name: value}
    of the tensors shipped quantized)."""
    cfg_cls, model_cls = classes(spec)
    torch.manual_seed(seed)
    cfg = cfg_cls(**spec.kwargs, **spec.sub_configs)
    _check_derived(spec, cfg)
    cfg._attn_implementation = "eager"
    model = model_cls(cfg)
    model.eval()
    INIT[spec.init](model, seed, spec)
    assert model.config.model_type == spec.model_type, (model.config.model_type, spec.model_type)
    model = model.to(torch.bfloat16)
    if spec.keep_fp32:
        assert _keep_fp32_(model), f"{spec.name}: no tensor HF keeps in float32"
    model.save_pretrained(str(out_dir), safe_serialization=True)
    # Keep only the two files the fixture contract names.
    for extra in out_dir.iterdir():
        if extra.name not in ("config.json", "model.safetensors"):
            extra.unlink()
    _check_sub_configs(spec, out_dir)
    if spec.shipped is None:
        return cfg, {}
    return cfg, shipped.ship(spec.shipped, out_dir, SHIPPED[spec.shipped])


def make_once(spec: FixtureSpec, out_root: Path, seed: int) -> None:
    name = spec.name
    # Build in a scratch folder; it replaces tests/fixtures/hf/<name> only once
    # the whole family passed every check (an interrupted run leaves the old one).
    final_dir = out_root / name
    out_dir = out_root / f".{name}.tmp"
    if out_dir.exists():
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True)
    cfg, values = _save_bf16(spec, out_dir, seed)

    # Reload the bf16 checkpoint as float32: weights are exactly the bf16 values,
    # rotary inv_freq is recomputed in float32 from the config.
    ref = load_fp32(out_dir)
    assert type(ref).__name__ == spec.model, type(ref).__name__
    for pname, p in list(ref.named_parameters()) + list(ref.named_buffers()):
        if not p.is_floating_point() or "inv_freq" in pname or "embed_scale" in pname:
            continue
        assert p.dtype == torch.float32, pname
        assert torch.equal(p, p.to(torch.bfloat16).float()), f"{pname} not bf16-exact"
    if values:
        print(f"   transformers read {shipped.check_dequantized(ref, values)} shipped "
              f"{spec.shipped} tensors as written")

    gen = torch.Generator().manual_seed(seed + 1)
    V = cfg.get_text_config().vocab_size
    prefill = torch.randint(0, V, (B, T0), generator=gen)
    d1 = torch.randint(0, V, (B, 1), generator=gen)
    d2 = torch.randint(0, V, (B, 1), generator=gen)
    full = torch.cat([prefill, d1, d2], dim=1)

    counter = sigmoid = None  # softmax routers; the sigmoid ones (DeepSeek, Muse Spark)
    if spec.router in ("softmax", "gpt_oss"):
        n_exp = getattr(cfg, "num_experts", None) or getattr(cfg, "num_local_experts", None)
        counter = RoutingCounter(ref, n_exp, attr="router" if spec.router == "gpt_oss" else "gate")
    elif spec.router == "deepseek":
        sigmoid = DeepseekRoutingCheck(ref)
    elif spec.router == "muse_spark":
        sigmoid = MuseSparkRoutingCheck(ref)
    states = StateRecorder(ref.config) if spec.linear_state else None

    with torch.no_grad():
        lp, l1, l2 = run_reference(ref, prefill, d1, d2, on_step=states)
        for h in (counter, sigmoid):
            if h:
                h.remove()
        # Self-check: cached decode == full-sequence recompute.
        lf = ref(input_ids=full, use_cache=False).logits.float().numpy()
        err_state = _check_states(name, ref, full, states) if states else 0.0
    err_cache = max(
        np.abs(lf[:, :T0] - lp).max(),
        np.abs(lf[:, T0 : T0 + 1] - l1).max(),
        np.abs(lf[:, T0 + 1 :] - l2).max(),
    )
    if spec.cache_retry and err_cache >= 1e-4:
        raise RoutingTooFragile(f"cached decode vs recompute diff {err_cache:.2e}")
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
        f"tie_word_embeddings={ref.config.get_text_config().tie_word_embeddings}"
    )
    print(f"   prefill_ids={prefill.tolist()} decode_1={d1.flatten().tolist()} decode_2={d2.flatten().tolist()}")
    print(
        f"   logits_prefill: std={lp.std():.3f} absmax={np.abs(lp).max():.3f} "
        f"max-softmax-prob mean={probs.max(-1).values.mean():.3f}; "
        f"decode_1 std={l1.std():.3f}; decode_2 std={l2.std():.3f}; "
        f"cache-vs-recompute maxdiff={err_cache:.2e}"
        + (f"; decode-vs-one-shot state maxdiff={err_state:.2e}" if states else "")
    )
    if spec.llama3_rope:
        print("   " + check_llama3_scaling(ref))
    if states:
        for i in states.layers:
            cs = states.arrays[f"conv_state_{i}_decode_2"]
            rs = states.arrays[f"recurrent_state_{i}_decode_2"]
            print(f"   layer {i} states: conv {list(cs.shape)} |x|max={np.abs(cs).max():.3f}; "
                  f"recurrent {list(rs.shape)} |S|max={np.abs(rs).max():.3f}")
    if counter:
        counter.report_and_check()
    if sigmoid and spec.router == "muse_spark":
        sigmoid.report_and_check()
    elif sigmoid:
        sigmoid.report_and_check(cfg.n_group, cfg.topk_group)
    for target, ablations in (("config", spec.ablations), ("model", spec.model_ablations)):
        for label, mutate in ablations:
            d = ablation_diff(out_dir, mutate, full, lf, target)
            print(f"   ablation {label}: logits move by {d:.4f}")
            assert d > ABLATION_MIN, f"{name}: ablating {label} moves the logits only by {d}"
    if spec.shipped == "nvfp4_experts":
        # What transformers 5.25 computes on its own: experts x their global scale.
        asis = load_fp32(out_dir, repair=False)
        with torch.no_grad():
            la = asis(input_ids=full, use_cache=False).logits.float().numpy()
        d = float(np.abs(la - lf).max())
        print(f"   experts as transformers 5.25 dequantizes them (global scales dropped): "
              f"logits move by {d:.4f}")
        assert d > ABLATION_MIN, f"{name}: the experts' global scales move the logits only by {d}"
    for label, target, mutate in spec.no_ops:
        d = ablation_diff(out_dir, mutate, full, lf, target)
        print(f"   no-op {label}: logits move by {d:.2e}")
        assert d <= NO_OP_MAX, f"{name}: {label} should not move the logits, moves them by {d}"

    if final_dir.exists():
        shutil.rmtree(final_dir)
    out_dir.rename(final_dir)


def _check_states(name: str, ref, full, states) -> float:
    """The chunked prefill form over all 7 tokens must land on the state the
    recurrent decode form reached after decode_2; their largest difference."""
    one_shot = StateRecorder(ref.config)
    out = ref(input_ids=full, use_cache=True)
    one_shot("full", out.cache if hasattr(out, "cache") else out.past_key_values)
    err_state = 0.0
    for i in states.layers:
        for kind in ("conv_state", "recurrent_state"):
            a = states.arrays[f"{kind}_{i}_decode_2"]
            b = one_shot.arrays[f"{kind}_{i}_full"]
            err_state = max(err_state, float(np.abs(a - b).max()))
    assert err_state < 1e-4, f"{name}: decode state vs one-shot state diff {err_state}"
    return err_state
