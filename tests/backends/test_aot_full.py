"""Full-size AOT compiles for TPU7x (libtpu, shapes only): the zoo's big models
fit the 64 MiB of VMEM by the compiler's own report, within 1 MiB of what the
plan says they use (its declared buffers and its estimate of the values Mosaic
keeps beside them), and compile time does not grow with the layer count (each
stack is one loop in the kernel)."""

import pytest

from megakernel.backends import pallas_tpu as backend
from megakernel.compiler.pipeline import plan_model
from megakernel.models import zoo

pytest.importorskip("libtpu")

MIB = 2**20


def _aot(model, devices, tmp_path):
    plan = plan_model(model, devices=devices, batch=1, tokens=1)
    out = tmp_path / f"{model.name}-{len(model.layers)}"
    backend.compile_model(model, plan, out)
    result = backend.aot_compile(out, plan, topology="tpu7x:2x2x1")
    assert result.vmem_used_bytes is not None
    assert result.vmem_used_bytes <= result.vmem_limit_bytes <= 64 * MIB, result.summary()
    assert abs(result.vmem_used_bytes - plan.memory.vmem_total) <= MIB, result.summary()
    return result


@pytest.mark.slow
@pytest.mark.aot
@pytest.mark.parametrize("name,devices", [("llama-3.2-1b", 1), ("qwen3-8b", 4),
                                          ("qwen3-30b-a3b", 8), ("mixtral-8x7b", 8)])
def test_full_size_compiles_within_vmem(name, devices, tmp_path):
    _aot(zoo.model(name), devices, tmp_path)


@pytest.mark.slow
@pytest.mark.aot
def test_64_layers_compile_within_1_5x_of_4_layers(tmp_path):
    model = zoo.model("qwen3-32b")
    assert len(model.layers) == 64
    cut = _aot(model.truncated(4), 8, tmp_path)
    full = _aot(model, 8, tmp_path)
    assert full.compile_seconds <= 1.5 * cut.compile_seconds, (full.summary(), cut.summary())
