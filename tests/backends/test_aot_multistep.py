"""A kernel of N greedy steps per call compiled for TPU7x (libtpu, shapes
only): Mosaic accepts the step loop (scalar stop rule, argmax VMEM -> SMEM,
ring banks that depend on the step), and the copies XLA adds around a
communicating kernel are paid once per call, so per step they are divided by N.

Measured (libtpu 0.0.51): tiny-moe on 4 cores, N=1 and N=16 both get 1.51 MiB
of copies per core per call (16 copies at N=16: the two SMEM stop operands
more), 0.095 MiB per step at N=16. qwen3-32b on 8 cores at N=16 (slow, 216 s
to compile on a shared 2-core machine): 257.3 MiB per core per call (13
copies: the KV caches in and out), 16.1 MiB per step (257 MiB per step at
N=1); VMEM 52.66 MiB compiled vs 52.00 MiB planned. The tiny hybrid of
tests/backends/test_gdn_op.py (bf16, 2 cores, N=4: Gated DeltaNet's stop rule,
a store under a scalar condition per sequence) compiles in 2.5-3.6 s, VMEM
0.78 MiB compiled vs 1.32 MiB planned; XLA copies 0.43 MiB per core per call,
of which 0.24 MiB are its states in and out (the planner's modeled copies,
compiler/choose_steps.py) and the rest packed weights and vectors.
"""

import dataclasses


import pytest

from megakernel.backends import pallas_tpu as backend
from megakernel.compiler.pipeline import plan_model
from megakernel.models import zoo

pytest.importorskip("libtpu")

MIB = 2**20


def _aot(model, devices, steps, tmp_path):
    plan = plan_model(model, devices=devices, batch=1, tokens=1, steps=steps)
    out = tmp_path / f"{model.name}-n{steps}"
    backend.compile_model(model, plan, out)
    return plan, backend.aot_compile(out, plan, topology="tpu7x:2x2x1")


def _cache_bytes(plan) -> int:
    return sum(b.nbytes for b in plan.memory.buffers if b.name.startswith("hbm.")
               and any(o.buffer == b.name and o.role == "cache" for o in plan.memory.operands))


@pytest.mark.aot
def test_copies_per_call_do_not_grow_with_steps(tmp_path):
    model = zoo.model("tiny-moe")
    _, one = _aot(model, 4, 1, tmp_path)
    plan, many = _aot(model, 4, 16, tmp_path)
    assert many.vmem_used_bytes <= many.vmem_limit_bytes, many.summary()
    # the same copies, plus the two 4-byte stop operands (end_id, limit)
    assert many.copy_bytes - one.copy_bytes <= 2 * 4 * plan.request.batch + 8, (one, many)
    assert many.copy_bytes / 16 < one.copy_bytes / 15


@pytest.mark.aot
def test_hybrid_steps_compile_and_copy_at_least_the_modeled_states(tmp_path):
    from megakernel.compiler.choose_steps import copy_bytes
    from megakernel.ir.config import build
    from tests.backends.test_gdn_op import HYBRID

    model = build(dataclasses.replace(HYBRID, dtype="bfloat16"))
    plan = plan_model(model, devices=2, batch=2, tokens=1, steps=4)
    out = tmp_path / "hybrid-n4"
    backend.compile_model(model, plan, out)
    res = backend.aot_compile(out, plan, topology="tpu7x:2x2x1")
    assert res.vmem_used_bytes <= res.vmem_limit_bytes, res.summary()
    # the states in and out (the model), plus small operands it leaves out
    assert copy_bytes(plan) <= res.copy_bytes <= 2 * copy_bytes(plan), res.summary()


@pytest.mark.slow
@pytest.mark.aot
def test_qwen3_32b_sixteen_steps_per_call(tmp_path):
    """The issue-14 case: every KV cache copied in and out once per call."""
    plan, res = _aot(zoo.model("qwen3-32b"), 8, 16, tmp_path)
    assert res.vmem_used_bytes <= res.vmem_limit_bytes <= 64 * MIB, res.summary()
    assert -MIB <= plan.memory.vmem_total - res.vmem_used_bytes <= MIB, res.summary()
    caches = _cache_bytes(plan)
    # per call: the caches copied in (aliased operands) and out (outputs), little else
    assert 2 * caches <= res.copy_bytes <= 2 * caches + 4 * MIB, (caches, res.summary())
    per_step = res.copy_bytes / plan.request.steps
    assert per_step <= res.copy_bytes / 16 + 1
    print(f"qwen3-32b/8 N=16: {res.copy_bytes / MIB:.1f} MiB per core per call, "
          f"{per_step / MIB:.1f} MiB per step; {res.summary()}")


@pytest.mark.aot
def test_mla_steps_compile(tmp_path):
    """MLA's stop rule (its latent row write under a per-sequence condition) in
    a 4-step kernel for 2 cores: 1.11 MiB VMEM compiled vs 1.50 MiB planned."""
    from tests.e2e.test_decode import mla

    model = mla("bfloat16")
    plan = plan_model(model, devices=2, batch=2, tokens=1, steps=4)
    out = tmp_path / "mla-n4"
    backend.compile_model(model, plan, out)
    res = backend.aot_compile(out, plan, topology="tpu7x:2x2x1")
    assert res.vmem_used_bytes <= plan.memory.vmem_total, res.summary()
