"""Drawn decode calls and their check through the generated kernel.

``decode_cases(model)`` draws batch size, tokens per step, start positions and
token ids for a model; ``check_case`` decodes one through the kernel in
interpret mode against the reference, ``assert_case`` as an assertion.
Sizes default to small values so each draw runs fast on a CPU.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
from hypothesis import strategies as st

from megakernel.ir.config import ModelConfig


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

@dataclass(frozen=True)
class CaseResult:
    batch: int
    tokens: int
    max_rel_err: float
    token_agreement: float
    tolerance: float
    mismatches: int = 0      # tokens unequal to the reference's
    near_ties: int = 0       # of those, near-ties (backends/pallas_tpu/check/against_reference.py near_ties)
    route_ties: int = 0      # sequences not compared: routing near-ties (run.py ROUTE_TIE)

    @property
    def ok(self) -> bool:
        from megakernel.backends.pallas_tpu.check.against_reference import tokens_agree

        return (tokens_agree(self.token_agreement, self.mismatches, self.near_ties)
                and self.max_rel_err <= self.tolerance)


# Plans, weights, kernels and runners are shared by the cases of a test, by
# plan digest (megakernel/testing/kernel_cache.py).


def check_case(model, case: DecodeCase, *, devices: int | None = None, seed: int = 0,
               fault: str | None = None, mesh=None) -> CaseResult:
    """Prefill with the reference, decode ``case`` through the generated kernel in
    interpret mode on ``devices`` cores (default: ``mesh``'s size, else 1), and
    compare tokens and logits with the reference.

    The set-up is checked first (enough devices, a model that plans for them):
    a SetupError naming the fix, never a counterexample (megakernel/testing/preflight.py)."""
    import jax.numpy as jnp

    from megakernel.testing import kernel_cache, preflight
    from megakernel.backends.pallas_tpu.check import against_reference as run
    from megakernel.models import reference

    import megakernel.kinds  # noqa: F401 - every op kind's rules

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
    got_logits, ref_logits = run.used_logits(model, got_logits, ref_logits)
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
