"""Decoding a Hugging Face parity fixture (tests/fixtures/hf/*) through
generated kernels, step by step against the logits transformers wrote."""

from __future__ import annotations

import numpy as np

from megakernel.errors import CheckError
from megakernel.testing.hf_expected import load_expected
from megakernel.testing.kernel_cache import kernel_module as _kernel_module


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

    from megakernel.backends.pallas_tpu.check import against_reference as run
    from megakernel.compiler.pipeline import plan_model
    from megakernel.ir.config import build
    from megakernel.models import reference
    from megakernel.models.checkpoint import load_checkpoint
    from megakernel.models.hf import from_hf

    import megakernel.kinds  # noqa: F401 - every op kind's rules

    if prefill not in ("kernel", "reference"):
        raise ValueError(f"prefill={prefill!r}: expected 'kernel' or 'reference'")
    folder = Path(folder)
    model = build(from_hf(folder, dtype="float32"))
    weights = load_checkpoint(folder, model)
    exp = load_expected(folder, model)
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
        if f"layers.{i}.gdn.recurrent" not in caches:
            raise CheckError(f"holds recurrent_state_{i}_{step}, but layer {i} has no Gated "
                             "DeltaNet state", path="expected.npz",
                             hint="write the fixture again from this config.json")
        conv = np.concatenate([np.asarray(caches[f"layers.{i}.gdn.hist_{p}"], np.float32)
                               for p in "qkv"], axis=-1).transpose(0, 2, 1)
        for key, want in ((f"conv_state_{i}_{step}", (*conv.shape[:2], conv.shape[2] + 1)),
                          (f"recurrent_state_{i}_{step}",
                           np.shape(caches[f"layers.{i}.gdn.recurrent"]))):
            if key not in exp or exp[key].shape != tuple(want):
                raise CheckError(f"{key}: expected shape {list(want)}, found "
                                 f"{list(exp[key].shape) if key in exp else 'none'}",
                                 path="expected.npz",
                                 hint="write the fixture again from this config.json")
        err = max(err, float(np.max(np.abs(conv - exp[f"conv_state_{i}_{step}"][:, :, 1:]))),
                  float(np.max(np.abs(np.asarray(caches[f"layers.{i}.gdn.recurrent"])
                                      - exp[f"recurrent_state_{i}_{step}"]))))
        i += 1
    return err
