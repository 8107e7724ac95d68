"""A library user's fresh process: each layer's package registers its own
rules for every op kind when imported (ir/, compiler/, models/ and
backends/pallas_tpu/codegen/ ``__init__.py``), so planning, emitting and the
reference work without ``megakernel.kinds`` (which only the entry points
import, for the start-up check)."""

import subprocess
import sys

SCRIPT = """
import dataclasses, sys
import numpy as np
from megakernel.backends.pallas_tpu.codegen.emit import render
from megakernel.compiler.pipeline import plan_model
from megakernel.ir.config import build
from megakernel.models import zoo
from megakernel.models.reference import as_jax, decode_step, init_caches
from megakernel.models.weights import init_weights
from tests.backends.test_gdn_op import HYBRID
from tests.e2e.test_decode import mla

for model in (zoo.model("tiny-moe"), mla(), build(HYBRID)):
    plan = plan_model(model, devices=2, batch=1, tokens=1)
    assert "pallas_call" in render(model, plan), model.name
for model in (mla(), build(HYBRID)):
    weights = as_jax(init_weights(model, 0))
    decode_step(model, weights, np.zeros((1, 1), np.int32), np.zeros((1,), np.int32),
                init_caches(model, 1))
assert "megakernel.kinds" not in sys.modules
print("ok")
"""


def test_plan_emit_and_reference_in_a_fresh_process_without_the_entry_points():
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True)
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr[-2000:]
