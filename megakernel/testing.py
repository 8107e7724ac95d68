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

from megakernel.ir.config import LinearAttentionConfig, MLAConfig, MoEConfig, ModelConfig


@st.composite
def moe_configs(draw, max_experts: int = 16) -> MoEConfig:
    num_experts = draw(st.integers(4, max_experts))
    shared = draw(st.integers(0, 1))
    limit = draw(st.sampled_from([None, 1.5]))       # gpt-oss's clamped SwiGLU (silu only)
    # DeepSeek's group-limited routing, when the experts split into groups of >= 2.
    n_group = draw(st.sampled_from([g for g in (1, 2, 4) if num_experts % g == 0
                                    and num_experts // g >= 2]))
    topk_group = draw(st.integers(1, n_group))
    eligible = topk_group * num_experts // n_group if n_group > 1 else num_experts
    return MoEConfig(
        num_experts=num_experts,
        top_k=draw(st.integers(1, min(4, eligible))),
        n_group=n_group, topk_group=topk_group if n_group > 1 else 1,
        expert_intermediate=draw(st.sampled_from([128, 256])),
        scoring=draw(st.sampled_from(["softmax", "sigmoid"])),
        correction_bias=draw(st.booleans()),
        renormalize=draw(st.booleans()),
        routed_scaling=draw(st.sampled_from([1.0, 2.5])),
        num_shared_experts=shared,
        shared_intermediate=128 if shared else 0,
        router_logit_bias=draw(st.booleans()),
        expert_bias=draw(st.booleans()),
        swiglu_limit=limit,
        swiglu_alpha=1.702 if limit else 1.0,
    )


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


@st.composite
def model_configs(draw, *, max_layers: int = 4, hidden_sizes=(128, 256, 384, 512),
                  moe: bool | None = None, dtype: str | None = None,
                  cores: int = 1, mla: bool | None = False) -> ModelConfig:
    """A valid card: dense or MoE (``moe=None`` draws either), 1..max_layers layers,
    with query heads that split evenly over ``cores`` TensorCores, and any of the
    families' options (norm placement, soft-caps, sinks, YaRN, mixed sliding
    and full layers, the embedding scale, the norm over all heads, gpt-oss's MoE);
    with multi-head latent attention when ``mla`` (None draws either)."""
    hidden = draw(st.sampled_from(hidden_sizes))
    kv_heads = draw(st.sampled_from([1, 2, 4]))
    q_heads = draw(st.sampled_from([kv_heads * g for g in (1, 2, 4, 8)
                                    if (kv_heads * g) % cores == 0 and kv_heads * g <= 16]))
    head_dim = draw(st.sampled_from([64, 128]))
    num_layers = draw(st.integers(1, max_layers))
    use_moe = draw(st.booleans()) if moe is None else moe
    moe_cfg = draw(moe_configs()) if use_moe else None
    first_k_dense = draw(st.integers(0, num_layers - 1)) if use_moe else 0
    rotary = draw(st.sampled_from([0, head_dim // 2]))
    scaling = draw(st.sampled_from([None, {"rope_type": "llama3", "factor": 8.0,
                                           "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                           "original_max_position": 64},
                                    {"rope_type": "yarn", "factor": 4.0,
                                     "original_max_position": 32, "truncate": False},
                                    {"rope_type": "yarn", "factor": 4.0, "beta_fast": 32.0,
                                     "beta_slow": 1.0, "original_max_position": 16,
                                     "mscale": 1.0, "mscale_all_dim": 0.5}]))
    activation = draw(st.sampled_from(["silu", "gelu", "gelu_tanh"]))
    if moe_cfg is not None and activation != "silu" and moe_cfg.swiglu_limit is not None:
        moe_cfg = dataclasses.replace(moe_cfg, swiglu_limit=None, swiglu_alpha=1.0)
    window = draw(st.sampled_from([None, 4, 16]))
    # Sliding and full layers alternating (Gemma 2, gpt-oss), the sliding ones
    # maybe with their own RoPE base (Gemma 3).
    mixed = window is not None and draw(st.booleans())
    pre_norms, post_norms = draw(st.sampled_from([(True, False), (True, True), (False, True)]))
    qk_norm = draw(st.booleans())
    # A norm over all heads sums over cores: only where no core holds a copy.
    all_heads = qk_norm and kv_heads % cores == 0 and draw(st.booleans())
    softcap, sinks = draw(st.sampled_from([None, 20.0])), draw(st.booleans())
    latent = draw(mla_blocks()) if (draw(st.booleans()) if mla is None else mla) else None
    if latent is not None:       # fields of GQA attention that MLA layers refuse
        rotary, qk_norm, all_heads, window, mixed, softcap, sinks = (
            0, False, False, None, False, None, False)
        scaling = scaling if latent.rope else None
    return ModelConfig(
        name="drawn",
        vocab_size=draw(st.sampled_from([256, 512])),
        hidden_size=hidden,
        num_layers=num_layers,
        num_q_heads=q_heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=draw(st.sampled_from([256, 512])),
        activation=activation,
        norm_eps=draw(st.sampled_from([1e-5, 1e-6])),
        norm_offset=draw(st.booleans()),
        rope_theta=draw(st.sampled_from([10000.0, 1e6])),
        rotary_dim=rotary,
        rope_scaling=scaling,
        qkv_bias=draw(st.booleans()),
        qk_norm=qk_norm,
        sliding_window=window,
        tie_embeddings=draw(st.booleans()),
        dtype=dtype or draw(st.sampled_from(["float32", "bfloat16"])),
        max_seq_len=64,
        moe=moe_cfg,
        first_k_dense=first_k_dense,
        layer_types=(("sliding_attention", "full_attention") * num_layers)[:num_layers]
        if mixed else None,
        sliding_rope_theta=draw(st.sampled_from([None, 1e4])) if mixed else None,
        pre_norms=pre_norms,
        post_norms=post_norms,
        qk_norm_all_heads=all_heads,
        attn_logit_softcap=softcap,
        attention_sinks=sinks,
        # Gemma's embedding scale beside pre-norms, as in Gemma: without them the
        # unnormalised x16 residual makes K/V entries of ~35, where the cache
        # comparisons' absolute 1e-5 is a few float32 ulps.
        scale_embeddings=pre_norms and draw(st.booleans()),
        final_logit_softcap=draw(st.sampled_from([None, 30.0])),
        mla=latent,
    )


@st.composite
def hybrid_configs(draw, *, cores: int = 1, max_periods: int = 2,
                   dtype: str | None = None) -> ModelConfig:
    """A valid Qwen3.5-like hybrid card: 1-3 Gated DeltaNet layers then one gated
    full-attention layer, repeated 1..max_periods times, with key, value, query and
    KV head counts that split (or, for key and KV heads, replicate) over ``cores``;
    half the draws use Qwen3-Next's MoE with a sigmoid-gated shared expert. The
    families' options that apply to any mixer are drawn too (norm placement,
    soft-caps, sinks, the embedding scale)."""
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
    dtype = dtype or draw(st.sampled_from(["float32", "bfloat16"]))
    # No input norms only in float32: in bfloat16 the un-normed residual makes
    # logit errors of ~1e-2 (within tolerance), and greedy tokens of near-tied
    # logits flip (measured: a top-2 gap of 6.7e-4 under an error of 8.6e-3).
    norms = [(True, False), (True, True)] + [(False, True)] * (dtype == "float32")
    pre_norms, post_norms = draw(st.sampled_from(norms))
    return ModelConfig(
        name="drawn-hybrid", vocab_size=256, hidden_size=128,
        num_layers=(linear + 1) * periods, num_q_heads=q, num_kv_heads=kv,
        head_dim=head_dim, intermediate_size=256, norm_offset=True, qk_norm=True,
        rotary_dim=draw(st.sampled_from([head_dim // 4, head_dim])), rope_theta=1e7,
        attn_output_gate=True, dtype=dtype,
        max_seq_len=64, moe=moe,
        layer_types=(("linear_attention",) * linear + ("full_attention",)) * periods,
        linear_attention=LinearAttentionConfig(
            hk, hv, draw(st.sampled_from([16, 32])), draw(st.sampled_from([16, 32])),
            draw(st.integers(2, 4))),
        pre_norms=pre_norms, post_norms=post_norms,
        scale_embeddings=pre_norms and draw(st.booleans()),   # as in model_configs
        attn_logit_softcap=draw(st.sampled_from([None, 20.0])),
        attention_sinks=draw(st.booleans()),
        final_logit_softcap=draw(st.sampled_from([None, 30.0])))


@dataclass(frozen=True)
class DecodeCase:
    """One decode call: ``tokens`` [B, T] at ``start`` [B], after a prefill of
    ``prompt`` from position 0; only ``prompt[b, :start[b]]`` stays visible."""

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
    # A fixed prompt length (positions past start[b] are overwritten by the new
    # tokens or masked as the future), so every draw reuses one compiled prefill.
    prompt = rng.integers(0, model.vocab_size, (b, max(ctx, 1)), dtype=np.int32)
    tokens = rng.integers(0, model.vocab_size, (b, t), dtype=np.int32)
    return DecodeCase(prompt, start, tokens)


def replace(config: ModelConfig, **changes) -> ModelConfig:
    """``dataclasses.replace`` for cards, also reaching into ``moe`` with ``moe__field``."""
    moe_changes = {k[5:]: v for k, v in changes.items() if k.startswith("moe__")}
    top = {k: v for k, v in changes.items() if not k.startswith("moe__")}
    if moe_changes:
        top["moe"] = dataclasses.replace(config.moe, **moe_changes)
    return dataclasses.replace(config, **top)


# ---------------------------------------------------------------------------
# Checking one drawn case through the generated kernel.

# Test-only fault injection: (description, text in kernel.py, replacement).
# Used to prove that the property check catches a broken kernel and shrinks it.
FAULTS = {
    "skip_attention_residual": ("the attention residual add is dropped",
                                "t_x_mid = t_x + t_attn_out", "t_x_mid = t_x"),
}


@dataclass(frozen=True)
class CaseResult:
    batch: int
    tokens: int
    max_rel_err: float
    token_agreement: float
    tolerance: float

    @property
    def ok(self) -> bool:
        return self.token_agreement == 1.0 and self.max_rel_err <= self.tolerance


_MODULES: dict = {}
_RUNNERS: dict = {}
_KERNELS: list = []   # the one temporary folder of this process's cached kernels


def _kernels_dir():
    """A temporary folder for the cached kernels, removed when the process exits:
    the modules stay imported (and their files readable, for error locations)
    while it runs, and no folder is left behind."""
    import atexit
    import shutil
    import tempfile
    from pathlib import Path

    if not _KERNELS:
        _KERNELS.append(Path(tempfile.mkdtemp(prefix="megakernel-cases-")))
        atexit.register(shutil.rmtree, _KERNELS[0], ignore_errors=True)
    return _KERNELS[0]


def _kernel_module(model, plan, fault: str | None):
    """Compile (once per plan digest and fault) and import the kernel module."""
    import tempfile
    from pathlib import Path

    from megakernel.backends.pallas_tpu import compile_model, load

    key = (plan.digest(), fault)
    if key not in _MODULES:
        path = Path(compile_model(model, plan, tempfile.mkdtemp(dir=_kernels_dir())))
        if fault is not None:
            _, old, new = FAULTS[fault]
            text = path.read_text()
            if old not in text:
                raise ValueError(f"fault {fault!r} does not apply to this kernel")
            path.write_text(text.replace(old, new))
        _MODULES[key] = load.import_module(path)
    return _MODULES[key]


def check_case(model, case: DecodeCase, *, devices: int = 1, seed: int = 0,
               fault: str | None = None) -> CaseResult:
    """Prefill with the reference, decode ``case`` through the generated kernel in
    interpret mode, and compare tokens and logits with the reference."""
    import jax.numpy as jnp

    from megakernel.backends.pallas_tpu import run
    from megakernel.compiler.pipeline import plan_model
    from megakernel.models import reference
    from megakernel.models.weights import init_weights

    b, t = case.tokens.shape
    plan = plan_model(model, devices=devices, batch=b, tokens=t)
    weights = init_weights(model, seed)
    w = reference.as_jax(weights)
    caches = reference.init_caches(model, b)
    _, caches = reference.decode_step_jit(model, w, jnp.asarray(case.prompt),
                                          jnp.zeros((b,), jnp.int32), caches)
    # One runner per plan: its jitted step and packed weights are reused, so a
    # shrinking search costs one interpret-mode call per case.
    key = (plan.digest(), fault, seed)
    if key not in _RUNNERS:
        _RUNNERS[key] = run.KernelRunner(_kernel_module(model, plan, fault), model, plan,
                                         weights, run.make_mesh(devices), run.interpret_params())
    runner = _RUNNERS[key]
    runner.set_caches({k: np.asarray(v) for k, v in caches.items()})
    ref_logits, _ = reference.decode_step_jit(model, w, jnp.asarray(case.tokens),
                                              jnp.asarray(case.start), caches)
    ref_logits = np.asarray(ref_logits)
    got_tokens, got_logits = runner.step(case.tokens, case.start)
    scale = 1.0 + float(np.max(np.abs(ref_logits)))
    return CaseResult(b, t, float(np.max(np.abs(got_logits - ref_logits))) / scale,
                      float(np.mean(got_tokens == ref_logits.argmax(-1))),
                      run.TOL[model.dtype.value])


def assert_case(model, case: DecodeCase, **kw) -> None:
    """``check_case`` as an assertion, for a user's hypothesis test."""
    result = check_case(model, case, **kw)
    assert result.ok, (f"kernel disagrees with the reference: {result} for start="
                       f"{case.start.tolist()} tokens={case.tokens.tolist()}")


def check_examples(model, *, examples: int = 10, devices: int = 1, max_batch: int = 4,
                   max_tokens: int = 2, fault: str | None = None,
                   shrink_budget: int = 25) -> str:
    """Property-check ``examples`` drawn cases; a failure raises CheckError with
    hypothesis' shrunk counterexample in the message.

    Each case is an interpret-mode kernel run, so shrinking gets a budget: after
    ``shrink_budget`` tries past the first failure, only the smallest failure
    found so far still fails, which ends the search there."""
    from hypothesis import given, settings

    from megakernel.errors import CheckError

    seen: list[str] = []
    state = {"tries": 0, "best": None}

    def key(case):
        return (case.batch, case.tokens.shape[1], case.start.tolist(), case.tokens.tolist())

    @settings(max_examples=examples, deadline=None, database=None, print_blob=False)
    @given(decode_cases(model, max_batch=max_batch, max_tokens=max_tokens,
                        max_context=min(model.max_seq_len, 64)))
    def prop(case):
        if state["best"] is not None:
            state["tries"] += 1
            if state["tries"] > shrink_budget and key(case) != state["best"]:
                return
        try:
            assert_case(model, case, devices=devices, fault=fault)
        except AssertionError:
            if state["best"] is None or key(case) < state["best"]:
                state["best"] = key(case)
            raise
        seen.append(f"B={case.batch} T={case.tokens.shape[1]} start={case.start.tolist()}")

    try:
        prop()
    except AssertionError as err:
        raise CheckError(f"counterexample after shrinking: {err}", path=model.name) from None
    return f"{len(seen)} drawn case(s) agree with the reference:\n  " + "\n  ".join(seen)


def check_hf_fixture(folder, *, devices: int = 1,
                     overrides=None) -> list[tuple[str, float]]:
    """Decode a Hugging Face fixture (``tests/fixtures/hf/*``) through generated
    kernels: a T0-token prefill, then two 1-token steps, each compared with the
    logits transformers wrote. Returns (step, max |err| / logit scale) pairs,
    and, for fixtures that store Gated DeltaNet states, (step + " states",
    max |err|) of the conv histories and recurrent states after each step.
    ``overrides``: the planner's (e.g. ``{"mla_form": "expanded"}``)."""
    from pathlib import Path

    from megakernel.backends.pallas_tpu import run
    from megakernel.compiler.pipeline import plan_model
    from megakernel.ir.config import build
    from megakernel.models import reference
    from megakernel.models.checkpoint import load_checkpoint
    from megakernel.models.hf import from_hf

    folder = Path(folder)
    model = build(from_hf(folder, dtype="float32"))
    weights = load_checkpoint(folder, model)
    exp = np.load(folder / "expected.npz")
    b, t0 = exp["prefill_ids"].shape
    steps = [("prefill", exp["prefill_ids"], 0, exp["logits_prefill"])] + [
        (f"decode_{i}", exp[f"decode_ids_{i}"], t0 + i - 1, exp[f"logits_decode_{i}"])
        for i in (1, 2)]
    caches = {k: np.asarray(v) for k, v in reference.init_caches(model, b).items()}
    out = []
    for name, ids, start, expected in steps:
        plan = plan_model(model, devices=devices, batch=b, tokens=ids.shape[1],
                          overrides=overrides)
        runner = run.KernelRunner(_kernel_module(model, plan, None), model, plan, weights,
                                  run.make_mesh(devices), run.interpret_params())
        runner.set_caches(caches)
        _, logits = runner.step(np.asarray(ids, np.int32), np.full((b,), start, np.int32))
        caches = runner.caches()
        scale = float(np.max(np.abs(expected)))
        out.append((name, float(np.max(np.abs(logits - expected))) / scale))
        if f"recurrent_state_0_{name}" in exp:
            out.append((f"{name} states", _gdn_state_error(caches, exp, name)))
    return out


def _gdn_state_error(caches, exp, step: str) -> float:
    """Max |ours - HF's| over the GDN layers' states after ``step``. HF keeps Kc
    raw conv columns [B, C, Kc], of which the last Kc - 1 are read again; ours
    are [B, Kc-1, C] per q/k/v section, and the recurrent state is [B, HV, dk, dv]
    in both."""
    err, i = 0.0, 0
    while f"recurrent_state_{i}_{step}" in exp:
        conv = np.concatenate([np.asarray(caches[f"layers.{i}.gdn.hist_{p}"], np.float32)
                               for p in "qkv"], axis=-1).transpose(0, 2, 1)
        err = max(err, float(np.max(np.abs(conv - exp[f"conv_state_{i}_{step}"][:, :, 1:]))),
                  float(np.max(np.abs(np.asarray(caches[f"layers.{i}.gdn.recurrent"])
                                      - exp[f"recurrent_state_{i}_{step}"]))))
        i += 1
    return err
