#!/usr/bin/env python3
"""Measure how far drawn models' kernels are from the reference, per family,
core count and all-reduce wire: the data behind ``run.WIRE_TOL``.

    .venv/bin/python tools/measure_wire.py hybrid 4 12 out.jsonl [bfloat16|float32]

Draws N bf16 cards (``hybrid``: hybrid_configs; ``moe`` / ``dense``:
model_configs with at most 2 layers) with a batch and tokens per step, plans
each on CORES virtual devices with the given wire (default: the planner's,
bf16), runs ``run.check`` (2 steps, strict interpret mode) and appends one JSON
line per draw: the logit error relative to 1 + the logit scale, the state
error and bounds, mismatched tokens and routing ties, and the card.
"""

import json
import sys

from hypothesis import strategies as st
from jax.experimental.pallas import tpu as pltpu

from megakernel.backends.pallas_tpu.check.kernel_check import check as check_kernel
from megakernel.backends.pallas_tpu.check.against_reference import Tolerances
from megakernel.compiler.pipeline import plan_model
from megakernel.ir.config import build
from megakernel.models.weights import init_weights
from megakernel.testing import hybrid_configs, model_configs
import megakernel.kinds  # noqa: F401,E402 - every op kind's rules


def main(argv: list[str]) -> int:
    kind, cores, n, out, *rest = argv
    cores, n = int(cores), int(n)
    wire = rest[0] if rest else None
    if kind == "hybrid":
        draws = st.tuples(hybrid_configs(cores=cores, dtype="bfloat16"),
                          st.integers(1, 4), st.integers(1, 4))
    else:
        draws = st.tuples(model_configs(cores=cores, moe=kind == "moe", max_layers=2,
                                        dtype="bfloat16"), st.integers(1, 8), st.integers(1, 4))
    for _ in range(n):
        card, batch, tokens = draws.example()
        model = build(card)
        plan = plan_model(model, devices=cores, batch=batch, tokens=tokens,
                          overrides={"wire": wire} if wire else None)
        try:
            r = check_kernel(model, plan, init_weights(model, seed=1), steps=2, seed=2)
        finally:
            pltpu.reset_tpu_interpret_mode_state()
        # the bound is Tolerances.logits x (1 + the logit scale)
        rel = r.max_abs_err / r.tolerance * Tolerances.of(model, plan).logits
        rec = dict(kind=kind, cores=cores, wire=plan.collectives.wire, batch=batch,
                   tokens=tokens, rel=rel, err=r.max_abs_err, tol=r.tolerance,
                   cache=r.cache_max_err, cache_tol=r.cache_tolerance,
                   mismatches=r.mismatches, near_ties=r.near_ties,
                   route_ties=r.route_ties, races=r.races, card=repr(card))
        with open(out, "a") as f:
            f.write(json.dumps(rec) + "\n")
        print(kind, cores, plan.collectives.wire, f"err {rel:.3g} of the scale, {r.max_abs_err:.4g} of bound "
              f"{r.tolerance:.4g}, state {r.cache_max_err:.4g} of {r.cache_tolerance:.4g}",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
