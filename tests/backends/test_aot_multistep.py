"""A kernel of N greedy steps per call compiled for TPU7x (libtpu, shapes
only): Mosaic accepts the step loop (scalar stop rule, argmax VMEM -> SMEM,
ring banks that depend on the step), and the copies XLA adds around a
communicating kernel stay small: the KV caches are passed read only and the
call's new rows written into them after the kernel, in the same jit
(backends/pallas_tpu/kernels/appended_state.py), so no copy grows with the context or N.

Measured (libtpu 0.0.51): tiny-moe on 4 cores, batch 2, N=16: 4,100 bytes
per core per call (the end id and next_token; was 1.51 MiB while the caches
were aliased: XLA copied them in and out). qwen3-32b on 8 cores at N=16
(slow, 119 s to compile on the shared machine): 4,112 bytes per core per call
(was 257.3 MiB), VMEM 49.70 MiB compiled vs 49.67 MiB planned. The tiny hybrid
of tests/backends/test_gdn_op.py (bf16, 2 cores, batch 2, N=4: Gated
DeltaNet's state rebuilt each step from the state before the call and the
call's update rows, a matmul of the window's keys and updates) compiles in
2.9 s, VMEM 2.39 MiB compiled vs 2.76 MiB planned; its state is read only and
its updates committed in the jit (backends/pallas_tpu/kernels/state_commit.py), so XLA
copies 4,100 bytes per core per call (next_token and the end id), the cost
model's figure (compiler/xla_copies.py, which --steps-per-call auto charges,
compiler/choose_steps.py; 219,140 bytes while the states were aliased and
copied in and out, 0.43 MiB while the KV caches were too and the operands in
XLA's default layouts).
"""

import dataclasses

import pytest

from megakernel.backends.pallas_tpu.aot.tpu_compile import aot_compile
from megakernel.backends.pallas_tpu.codegen.load import compile_model
from megakernel.compiler.pipeline import plan_model
from megakernel.models import zoo

pytest.importorskip("libtpu")

MIB = 2**20


def _aot(model, devices, steps, tmp_path):
    plan = plan_model(model, devices=devices, batch=1, tokens=1, steps=steps)
    out = tmp_path / f"{model.name}-n{steps}"
    compile_model(model, plan, out)
    return plan, aot_compile(out, plan, topology="tpu7x:2x2x1")


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
    # no cache is copied: issue 19's bound, 1 MiB per core per call
    assert many.copy_bytes <= MIB and one.copy_bytes <= MIB, (one.summary(), many.summary())


@pytest.mark.aot
def test_hybrid_steps_compile_and_copy_the_modeled_states(tmp_path):
    from megakernel.ir.config import build
    from tests.backends.test_gdn_op import HYBRID

    model = build(dataclasses.replace(HYBRID, dtype="bfloat16"))
    plan = plan_model(model, devices=2, batch=2, tokens=1, steps=4)
    out = tmp_path / "hybrid-n4"
    compile_model(model, plan, out)
    res = aot_compile(out, plan, topology="tpu7x:2x2x1")
    assert res.vmem_used_bytes <= res.vmem_limit_bytes, res.summary()
    # next_token and the step scalars only (the state is read only, its updates
    # committed in the jit): the cost model's copies (compiler/xla_copies.py)
    assert plan.cost.copy_bytes == res.copy_bytes <= MIB, res.summary()


@pytest.mark.slow
@pytest.mark.aot
def test_qwen3_32b_sixteen_steps_per_call(aot_zoo):
    """The issue-14 case: no KV cache is copied (issue 19: at most 1 MiB of
    copies per core per call)."""
    plan, res = aot_zoo("qwen3-32b", 8, steps=16)
    assert res.vmem_used_bytes <= res.vmem_limit_bytes <= 64 * MIB, res.summary()
    assert -MIB <= plan.memory.vmem_total - res.vmem_used_bytes <= MIB, res.summary()
    caches = _cache_bytes(plan)
    assert res.copy_bytes <= MIB < caches, (caches, res.summary())
    per_step = res.copy_bytes / plan.request.steps
    print(f"qwen3-32b/8 N=16: {res.copy_bytes / MIB:.1f} MiB per core per call, "
          f"{per_step / MIB:.1f} MiB per step; {res.summary()}")


@pytest.mark.aot
def test_mla_steps_compile(tmp_path):
    """MLA's stop rule (its latent rows put in the window under a per-sequence
    condition) in a 4-step kernel for 2 cores: 3.16 MiB VMEM compiled vs 3.58
    MiB planned; the latent cache is read only, so it is not copied around
    the call (4,100 bytes per core per call: next_token and the end id)."""
    from tests.e2e.test_decode import mla

    model = mla("bfloat16")
    plan = plan_model(model, devices=2, batch=2, tokens=1, steps=4)
    out = tmp_path / "mla-n4"
    compile_model(model, plan, out)
    res = aot_compile(out, plan, topology="tpu7x:2x2x1")
    assert res.vmem_used_bytes <= plan.memory.vmem_total, res.summary()
    assert res.copy_bytes <= MIB and plan.cost.copy_bytes == res.copy_bytes, res.summary()
