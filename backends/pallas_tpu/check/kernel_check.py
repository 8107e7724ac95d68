"""Check: decode steps of the generated kernel in TPU interpret mode against
the plain-JAX reference - one step at a time, or one call of a multi-step plan
(multistep.py) - with the runner and tolerances of against_reference.py."""

from __future__ import annotations

import time

import jax.numpy as jnp
import numpy as np

from megakernel.backends.pallas_tpu.check.against_reference import (
    CheckResult, KernelRunner, Tolerances, interpret_params, make_mesh, near_ties, races_found,
    reference_step, used_logits)
from megakernel.backends.pallas_tpu.check.multistep import check_steps
from megakernel.models import reference


def check_positions(model, plan, steps: int, prompt: int = 3) -> None:
    """Refuse a check whose positions would pass ``max_seq_len``: a ``prompt``
    of positions, then row b of the batch starting b positions later and each
    step advancing ``tokens`` positions (one call of N steps for a multi-step
    plan, whatever ``steps``)."""
    from megakernel.errors import CheckError

    b, t, n = plan.request.batch, plan.request.tokens, plan.request.steps
    steps, t = (n, 1) if n > 1 else (steps, t)
    room = model.max_seq_len - prompt - (b - 1)     # positions the last row may use
    if steps * t <= room:
        return
    what = f"{n} steps in one call" if n > 1 else f"{steps} step(s) of {t} token(s)"
    rows = f", the last of {b} rows starting {b - 1} positions later," if b > 1 else ""
    fits = [f"--steps-per-call at most {room}" if n > 1 else f"--steps at most {room // t}"
            ] if room >= t else []
    most_rows = model.max_seq_len - prompt - steps * t + 1
    fits += [f"--batch at most {most_rows}"] if b > 1 and most_rows >= 1 else []
    raise CheckError(f"{what} after a {prompt}-token prompt{rows} reach position "
                     f"{prompt + b - 1 + steps * t - 1}, past the max_seq_len="
                     f"{model.max_seq_len} positions of {model.name}", path="check.steps",
                     hint="give " + " or ".join(fits) if fits else
                     "check a model with a longer max_seq_len")


def check(model, plan, weights, *, steps: int = 2, seed: int = 0, module=None, out_dir=None,
          interpret=None, prompt: int = 3, multistep: dict | None = None) -> CheckResult:
    """Run ``steps`` decode steps of the kernel against the reference; a
    multi-step plan runs one call of its N steps instead (``multistep``: the
    ``end_at``/``limit`` of ``run_steps.check_steps``)."""
    from megakernel.backends.pallas_tpu.codegen.load import compile_model
    from megakernel.backends.pallas_tpu.codegen import load

    check_positions(model, plan, steps, prompt)
    if module is None and out_dir is None:
        import tempfile

        # A kernel written only for this check is removed when the check ends,
        # pass or fail, so checks leave no folders in the temp directory.
        with tempfile.TemporaryDirectory(prefix="megakernel-check-") as tmp:
            return check(model, plan, weights, steps=steps, seed=seed, out_dir=tmp,
                         interpret=interpret, prompt=prompt, multistep=multistep)
    if module is None:
        module = load.import_module(compile_model(model, plan, out_dir))
    b, t = plan.request.batch, plan.request.tokens
    interpret = interpret if interpret is not None else interpret_params()
    if plan.request.steps > 1:      # one call of N greedy steps (run_steps.py)
        return check_steps(model, plan, weights, module, interpret, seed=seed, prompt=prompt,
                           **(multistep or {}))
    t0 = time.perf_counter()
    runner = KernelRunner(module, model, plan, weights, make_mesh(plan.shard.cores), interpret)
    w = reference.as_jax(weights)
    rng = np.random.default_rng(seed)
    caches = reference.init_caches(model, b)
    prompt_tokens = jnp.asarray(rng.integers(0, model.vocab_size, (b, prompt)), jnp.int32)
    logits, caches = reference.decode_step_jit(model, w, prompt_tokens,
                                               jnp.zeros((b,), jnp.int32), caches)
    runner.set_caches({k: np.asarray(val) for k, val in caches.items()})
    tokens = np.asarray(rng.integers(0, model.vocab_size, (b, t)), np.int32)
    start = prompt + np.arange(b, dtype=np.int32)
    errs, cache_err, scale, cache_scale = [], 0.0, 0.0, 0.0
    mismatches = ties = compared = 0
    tied = np.zeros(b, bool)
    tol = Tolerances.of(model, plan)
    for _ in range(steps):
        ref_logits, caches, ties_now = reference_step(model, w, tokens, start, caches,
                                                      tol.route_tie)
        tied |= ties_now
        keep = ~tied
        nxt, got = runner.step(tokens, start)
        if races_found():
            return CheckResult(float("inf"), 0.0, float("inf"), steps,
                               time.perf_counter() - t0, True, 0.0)
        ref_tok = ref_logits.argmax(-1)
        got, ref_logits = used_logits(model, got, ref_logits)
        off, tied_tokens = near_ties(nxt[keep], got[keep], ref_logits[keep])
        mismatches, ties, compared = mismatches + off, ties + tied_tokens, compared + keep.sum() * t
        scale = max(scale, float(np.max(np.abs(ref_logits))))
        errs.append(float(np.max(np.abs(got[keep] - ref_logits[keep]), initial=0.0)))
        kc = runner.caches()
        for name, ref in caches.items():
            ref = np.asarray(ref).astype(np.float32)
            diff = np.abs(kc[name].astype(np.float32) - ref)[keep]
            cache_err = max(cache_err, float(np.max(diff, initial=0.0)))
            cache_scale = max(cache_scale, float(np.max(np.abs(ref))))
        tokens, start = ref_tok.astype(np.int32), start + t
    return CheckResult(max(errs), 1.0 - mismatches / max(compared, 1), cache_err, steps,
                       time.perf_counter() - t0, False, tol.logits * (1.0 + scale), errs,
                       tol.state * (1.0 + cache_scale), mismatches=mismatches,
                       near_ties=ties, route_ties=int(tied.sum()), bounds=tol,
                       logit_scale=scale, cache_scale=cache_scale)
