"""Several greedy decode steps in one kernel call (steps_per_call N > 1).

Each case plans a small model for N steps per call, emits its kernel and runs
ONE call in strict interpret mode (race detector on, out-of-bounds reads
raise): its N tokens must equal N single greedy steps of the reference, fed
back one to the next, and every cache must equal the reference's after them.
With an end id (the reference's token of row 0 at a middle step) row 0 must
stop there: later lanes repeat the end id and its cache stops changing; with a
length limit a row stops when its next position reaches it. The hybrid
model (Gated DeltaNet) carries its conv histories and recurrent states across
the steps: a stopped row's states must stay as they were (compared with the
reference's after the N steps, like every cache); so does MLA's latent cache.
"""

import dataclasses

import numpy as np
import pytest

from megakernel.backends.pallas_tpu.check.kernel_check import check as check_kernel
from megakernel.compiler.pipeline import plan_model
from megakernel.errors import PlanningError
from megakernel.models.weights import init_weights

from megakernel.ir.config import build
from tests.backends.test_gdn_op import HYBRID
from tests.e2e.test_decode import dense, mla, moe


def hybrid(dtype="float32"):
    """Two repetitions of 3 Gated DeltaNet + 1 gated attention layer (the parity
    slots both used, the last repetition's writes drained before the next step
    fetches repetition 0 again)."""
    return build(dataclasses.replace(HYBRID, dtype=dtype))

CASES = [  # (id, model factory, devices, batch, steps, multistep check options)
    ("dense-f32-1dev", lambda: dense(), 1, 2, 4, None),
    ("dense-f32-1dev-end-limit", lambda: dense(), 1, 2, 4,
     dict(end_at=1, limit=np.array([64, 6], np.int32))),
    ("moe-f32-1dev-end", lambda: moe(), 1, 2, 3, dict(end_at=1)),
    ("dense-bf16-2dev-end", lambda: dense("bfloat16"), 2, 3, 3, dict(end_at=1)),
    ("hybrid-f32-1dev-end-limit", lambda: hybrid(), 1, 2, 3,
     dict(end_at=1, limit=np.array([64, 6], np.int32))),
    ("hybrid-bf16-2dev-end", lambda: hybrid("bfloat16"), 2, 2, 3, dict(end_at=1)),
    ("mla-f32-1dev-end-limit", lambda: mla(), 1, 2, 3,
     dict(end_at=1, limit=np.array([64, 5], np.int32))),
]
SLOW = [
    ("moe-bf16-4dev-end", lambda: moe("bfloat16"), 4, 2, 2, dict(end_at=0)),
    ("dense-f32-4dev", lambda: dense(), 4, 1, 3, None),
]


@pytest.mark.parametrize("make,devices,batch,steps,options", [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_n_steps_match_n_reference_steps(make, devices, batch, steps, options, tmp_path):
    _check(make, devices, batch, steps, options, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("make,devices,batch,steps,options", [c[1:] for c in SLOW],
                         ids=[c[0] for c in SLOW])
def test_n_steps_match_n_reference_steps_slow(make, devices, batch, steps, options, tmp_path):
    _check(make, devices, batch, steps, options, tmp_path)


def _check(make, devices, batch, steps, options, tmp_path):
    model = make()
    plan = plan_model(model, devices=devices, batch=batch, steps=steps)
    result = check_kernel(model, plan, init_weights(model, seed=1), seed=2, out_dir=tmp_path,
                           multistep=options)
    assert not result.races
    assert result.token_agreement == 1.0, result
    assert result.ok, result
    assert result.tokens.shape == (batch, steps)
    if options and "end_at" in options:     # row 0 stopped at its end id: it repeats
        end = result.tokens[0, options["end_at"]]
        assert (result.tokens[0, options["end_at"]:] == end).all(), result.tokens
    if options and "limit" in options:      # row 1 starts at 4: positions 4, 5 then stop
        assert (result.tokens[1, 2:] == (end if "end_at" in options else -1)).all()


def test_steps_per_call_needs_one_token_per_step():
    with pytest.raises(PlanningError, match="tokens=1") as err:
        plan_model(dense(), devices=1, batch=1, tokens=2, steps=4)
    assert err.value.path == "request.tokens"
    with pytest.raises(PlanningError, match="steps_per_call") as err:
        plan_model(dense(), devices=1, steps=129)
