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
from megakernel.strategies import model_graphs, with_features  # noqa: F401 - model_graphs re-exported


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
                  moe: bool | None = None, dtype: str | None = None,
                  cores: int = 1, without=(), require=()) -> ModelConfig:
    """A valid card: dense or MoE (``moe=None`` draws either), 1..max_layers layers,
    with query heads that split evenly over ``cores`` TensorCores. Every feature of
    ``megakernel.strategies.FEATURES`` may be drawn; ``without`` / ``require`` name
    features never / always used (``without="moe"``, ``require=("layer_pattern",)``)."""
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
                                           "original_max_position": 64}]))
    card = ModelConfig(
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
    # The features the table draws or restricts (megakernel/strategies.py).
    return draw(with_features(card, cores=cores, without=without, require=require))


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
    # The token seed as four numbers below 100: hypothesis sometimes draws an
    # integer from the constants of the local modules loaded, and leaves out
    # those below 100, so the draw of a seeded run does not depend on which
    # modules the process loaded (the CLI's or pytest's; docs/property-testing.md).
    rng = np.random.default_rng(draw(st.lists(st.integers(0, 99), min_size=4, max_size=4)))
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


# Plans, weights, kernels and runners are shared by the cases of a test, by
# plan digest (megakernel/kernel_cache.py); check_hf_fixture uses the modules.
from megakernel.kernel_cache import kernel_module as _kernel_module  # noqa: E402


def check_case(model, case: DecodeCase, *, devices: int | None = None, seed: int = 0,
               fault: str | None = None, mesh=None) -> CaseResult:
    """Prefill with the reference, decode ``case`` through the generated kernel in
    interpret mode on ``devices`` cores (default: ``mesh``'s size, else 1), and
    compare tokens and logits with the reference.

    The set-up is checked first (enough devices, a model that plans for them):
    a SetupError naming the fix, never a counterexample (megakernel/preflight.py)."""
    import jax.numpy as jnp

    from megakernel import kernel_cache, preflight
    from megakernel.backends.pallas_tpu import run
    from megakernel.models import reference

    devices = devices or (mesh.devices.size if mesh is not None else 1)
    preflight.require_devices(devices, mesh=mesh)
    preflight.require_plan(model, devices)
    b, t = case.tokens.shape
    plan = kernel_cache.plan(model, devices, b, t)
    _, w = kernel_cache.weights(model, seed)
    caches = reference.init_caches(model, b)
    _, caches = reference.decode_step_jit(model, w, jnp.asarray(case.prompt),
                                          jnp.zeros((b,), jnp.int32), caches)
    # One runner per plan: its jitted step and packed weights are reused, so a
    # shrinking search costs one interpret-mode call per case.
    runner = kernel_cache.runner(model, plan, seed, fault,
                                 mesh if mesh is not None else run.make_mesh(devices))
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


def check_examples(model, **kw) -> str:
    """The CLI's ``check --examples``: ``megakernel.properties.check_examples``
    (hypothesis seeded by ``seed=``; the shrunk counterexample as a CheckError)."""
    from megakernel.properties import check_examples as run_examples

    return run_examples(model, **kw)


def check_hf_fixture(folder, *, devices: int = 1) -> list[tuple[str, float]]:
    """Decode a Hugging Face fixture (``tests/fixtures/hf/*``) through generated
    kernels: a T0-token prefill, then two 1-token steps, each compared with the
    logits transformers wrote. Returns (step, max |err| / logit scale) pairs."""
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
        plan = plan_model(model, devices=devices, batch=b, tokens=ids.shape[1])
        runner = run.KernelRunner(_kernel_module(model, plan, None), model, plan, weights,
                                  run.make_mesh(devices), run.interpret_params())
        runner.set_caches(caches)
        _, logits = runner.step(np.asarray(ids, np.int32), np.full((b,), start, np.int32))
        caches = runner.caches()
        scale = float(np.max(np.abs(expected)))
        out.append((name, float(np.max(np.abs(logits - expected))) / scale))
    return out
