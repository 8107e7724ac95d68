"""Hypothesis strategies for users' (and our own) property tests.

``model_configs()`` draws cards inside the supported space, over one table of
features (megakernel/strategies.py), and ``model_graphs()`` built models with the
op kinds no card writes (megakernel/graph_strategies.py); ``mla_blocks()`` and
``hybrid_configs()`` the latent-attention blocks and Gated DeltaNet hybrids
(mla_strategies.py, hybrid_strategies.py); ``decode_cases(model)``
draws batch size, tokens per step, start positions and token ids for a model.
Sizes default to small values so each draw runs fast on a CPU.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
from hypothesis import strategies as st

from megakernel.graph_strategies import model_graphs  # noqa: F401 - re-exported
from megakernel.hybrid_strategies import hybrid_configs  # noqa: F401 - re-exported
from megakernel.ir.config import ModelConfig
from megakernel.strategies import (  # noqa: F401 - re-exported
    mla_blocks, moe_configs, model_configs)


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
    mismatches: int = 0      # tokens unequal to the reference's
    near_ties: int = 0       # of those, near-ties (backends/pallas_tpu/run.py near_ties)
    route_ties: int = 0      # sequences not compared: routing near-ties (run.py ROUTE_TIE)

    @property
    def ok(self) -> bool:
        from megakernel.backends.pallas_tpu.run import tokens_agree

        return (tokens_agree(self.token_agreement, self.mismatches, self.near_ties)
                and self.max_rel_err <= self.tolerance)


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
    tol = run.Tolerances.of(model, plan)
    ref_logits, _, tied = run.reference_step(model, w, case.tokens, case.start, caches,
                                             tol.route_tie)
    keep = ~tied
    got_tokens, got_logits = runner.step(case.tokens, case.start)
    scale = 1.0 + float(np.max(np.abs(ref_logits)))
    mismatches, ties = run.near_ties(got_tokens[keep], got_logits[keep], ref_logits[keep])
    err = float(np.max(np.abs(got_logits[keep] - ref_logits[keep]), initial=0.0))
    return CaseResult(b, t, err / scale, 1.0 - mismatches / max(int(keep.sum()) * t, 1),
                      tol.logits, mismatches, ties, int((~keep).sum()))


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


def check_hf_fixture(folder, *, devices: int = 1, overrides=None,
                     prefill: str = "kernel") -> list[tuple[str, float]]:
    """Decode a Hugging Face fixture (``tests/fixtures/hf/*``) through generated
    kernels: a T0-token prefill, then two 1-token steps, each compared with the
    logits transformers wrote. Returns (step, max |err| / logit scale) pairs,
    and, for fixtures that store Gated DeltaNet states, (step + " states",
    max |err|) of the conv histories and recurrent states after each step.
    ``overrides``: the planner's (e.g. ``{"mla_form": "expanded"}``).
    ``prefill="reference"`` runs the prefill through the plain-JAX reference
    (compared with transformers all the same) and only the two decode steps
    through a kernel: one kernel to build instead of two."""
    from pathlib import Path

    import jax.numpy as jnp

    from megakernel.backends.pallas_tpu import run
    from megakernel.compiler.pipeline import plan_model
    from megakernel.ir.config import build
    from megakernel.models import reference
    from megakernel.models.checkpoint import load_checkpoint
    from megakernel.models.hf import from_hf

    if prefill not in ("kernel", "reference"):
        raise ValueError(f"prefill={prefill!r}: expected 'kernel' or 'reference'")
    folder = Path(folder)
    model = build(from_hf(folder, dtype="float32"))
    weights = load_checkpoint(folder, model)
    exp = np.load(folder / "expected.npz")
    b, t0 = exp["prefill_ids"].shape
    steps = [("prefill", exp["prefill_ids"], 0, exp["logits_prefill"])] + [
        (f"decode_{i}", exp[f"decode_ids_{i}"], t0 + i - 1, exp[f"logits_decode_{i}"])
        for i in (1, 2)]
    caches = {k: np.asarray(v) for k, v in reference.init_caches(model, b).items()}
    out, runners = [], {}
    for name, ids, start, expected in steps:
        if name == "prefill" and prefill == "reference":
            logits, caches = reference.decode_step_jit(
                model, reference.as_jax(weights), jnp.asarray(ids, jnp.int32),
                jnp.zeros((b,), jnp.int32), caches)
            logits, caches = np.asarray(logits), {k: np.asarray(v) for k, v in caches.items()}
            _compare(out, exp, name, logits, expected, caches)
            continue
        plan = plan_model(model, devices=devices, batch=b, tokens=ids.shape[1],
                          overrides=overrides)
        # The decode steps share one kernel: one runner, traced and compiled once.
        runner = runners.get(plan.digest())
        if runner is None:
            runner = runners[plan.digest()] = run.KernelRunner(
                _kernel_module(model, plan, None), model, plan, weights,
                run.make_mesh(devices), run.interpret_params())
        runner.set_caches(caches)
        _, logits = runner.step(np.asarray(ids, np.int32), np.full((b,), start, np.int32))
        caches = runner.caches()
        _compare(out, exp, name, logits, expected, caches)
    return out


def _compare(out, exp, name, logits, expected, caches) -> None:
    """Append step ``name``'s logit error (and its GDN states' error) to ``out``."""
    scale = float(np.max(np.abs(expected)))
    out.append((name, float(np.max(np.abs(logits - expected))) / scale))
    if f"recurrent_state_0_{name}" in exp:
        out.append((f"{name} states", _gdn_state_error(caches, exp, name)))


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
