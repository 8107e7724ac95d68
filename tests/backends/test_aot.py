"""AOT compile of the generated kernel for TPU7x (needs libtpu)."""

import pytest

from megakernel.backends.pallas_tpu.aot.tpu_compile import aot_compile
from megakernel.backends.pallas_tpu.codegen.load import compile_model
from megakernel.compiler.pipeline import plan_model
from megakernel.compiler.xla_copies import xla_copies
from megakernel.models import zoo

pytest.importorskip("libtpu")


@pytest.mark.aot
@pytest.mark.parametrize("name,devices", [("tiny-dense", 2), ("tiny-moe", 4)])
def test_compiles_for_tpu7x(name, devices, tmp_path):
    model = zoo.model(name)
    plan = plan_model(model, devices=devices, batch=2, tokens=1)
    compile_model(model, plan, tmp_path)
    result = aot_compile(tmp_path, plan, topology="tpu7x:2x2x1")
    assert result.vmem_used_bytes is not None and result.vmem_used_bytes > 0
    assert result.vmem_used_bytes <= result.vmem_limit_bytes
    # The plan's VMEM (declared buffers + Mosaic's values) is the compiler's, within 1 MiB.
    assert abs(result.vmem_used_bytes - plan.memory.vmem_total) <= 2**20, result.summary()
    # The KV caches are read only (new rows written after the kernel, same jit):
    # XLA copies at most 1 MiB per core per call around it (issue 19), and the
    # cost model charges exactly the copies the compiler made.
    assert result.copy_bytes <= 2**20, result.summary()
    assert plan.cost.copy_bytes == result.copy_bytes, (xla_copies(plan.memory, devices),
                                                        result.copies)


@pytest.mark.aot
def test_every_activation_compiles_for_tpu7x(tmp_path):
    """A dense model with each activation of the table in its MLP, and the
    elementwise kinds and logit soft-capping around it, lowers through Mosaic
    (exact GELU through erf: jax.nn.gelu's erfc has no Mosaic rule)."""
    from megakernel.ir.config import ModelConfig, build
    from megakernel.ir.ops import Activation

    for act in Activation:
        model = build(ModelConfig(f"act-{act.value}".replace("_", "-"), 512, 256, 1, 2, 1, 128,
                                  256, activation=act.value, final_logit_softcap=30.0,
                                  max_seq_len=128))
        plan = plan_model(model, devices=1, batch=1, tokens=1)
        compile_model(model, plan, tmp_path / act.value)
        result = aot_compile(tmp_path / act.value, plan, topology="tpu7x:2x2x1")
        assert result.vmem_used_bytes is not None, act
