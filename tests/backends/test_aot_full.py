"""Full-size AOT compiles for TPU7x (libtpu, shapes only): the zoo's big models,
one public size of each family, fit the 64 MiB of VMEM by the compiler's own
report, within 1 MiB of what the plan says they use (its declared buffers and
its estimate of the values Mosaic keeps beside them), and compile time does not
grow with the layer count (each stack is one loop in the kernel)."""

import pytest

from megakernel.backends import pallas_tpu as backend
from megakernel.compiler.pipeline import plan_model
from megakernel.models import zoo

pytest.importorskip("libtpu")

MIB = 2**20


def _aot(model, devices, tmp_path, over=0):
    """``over``: bytes the plan may exceed the compiled figure by beyond 1 MiB."""
    plan = plan_model(model, devices=devices, batch=1, tokens=1)
    out = tmp_path / f"{model.name}-{len(model.layers)}"
    backend.compile_model(model, plan, out)
    result = backend.aot_compile(out, plan, topology="tpu7x:2x2x1")
    assert result.vmem_used_bytes is not None
    assert result.vmem_used_bytes <= result.vmem_limit_bytes <= 64 * MIB, result.summary()
    assert -MIB <= plan.memory.vmem_total - result.vmem_used_bytes <= MIB + over, \
        result.summary()
    return result


@pytest.mark.slow
@pytest.mark.aot
@pytest.mark.parametrize("name,devices", [("llama-3.2-1b", 1), ("qwen3-8b", 4),
                                          ("qwen3-30b-a3b", 8), ("mixtral-8x7b", 8)])
def test_full_size_compiles_within_vmem(name, devices, tmp_path):
    _aot(zoo.model(name), devices, tmp_path)


# One public size per family of issue 15. Measured (libtpu 0.0.51, this shared
# machine), compiled vs planned VMEM and compile time: mistral-7b-v0.1 x8 52.31
# vs 52.70 MiB, 22 s; gemma-2-2b x4 53.04 vs 55.02 MiB, 29 s; gemma-3-1b x1
# 43.32 vs 45.21 MiB, 245 s (54 s unloaded; a 6-layer body); olmo-2-7b x8 52.73
# vs 52.64 MiB, 28 s; gpt-oss-20b x8 51.24 vs 51.56 MiB, 18 s; phi-3-mini-4k x4
# 46.42 vs 45.86 MiB, 54 s.
# The two Gemmas compile about 2 MiB under their plan: a norm vector's buffer
# [2, 1, hidden] bf16 is planned with 16 padded rows (layout.padded_bytes) but
# Mosaic packs a one-row array (measured: 8 buffers [2, 1, 2304] bf16 compile
# to 152 KiB, planned 1.1 MiB), and Gemma has four norms a layer. The plan is
# safe (over, never under); it is held to at most 1.5 MiB more than the others
# until the planner sizes one-row arrays as Mosaic does.
_PLAN_OVER = {"gemma-2-2b": int(1.5 * MIB), "gemma-3-1b": int(1.5 * MIB)}


@pytest.mark.slow
@pytest.mark.aot
@pytest.mark.parametrize("name,devices", [
    ("mistral-7b-v0.1", 8), ("gemma-2-2b", 4), ("gemma-3-1b", 1), ("olmo-2-7b", 8),
    ("gpt-oss-20b", 8), ("phi-3-mini-4k", 4)])
def test_family_full_size_compiles_within_vmem(name, devices, tmp_path):
    _aot(zoo.model(name), devices, tmp_path, over=_PLAN_OVER.get(name, 0))


@pytest.mark.slow
@pytest.mark.aot
def test_64_layers_compile_within_1_5x_of_4_layers(tmp_path):
    model = zoo.model("qwen3-32b")
    assert len(model.layers) == 64
    cut = _aot(model.truncated(4), 8, tmp_path)
    full = _aot(model, 8, tmp_path)
    assert full.compile_seconds <= 1.5 * cut.compile_seconds, (full.summary(), cut.summary())
