"""Muse Spark's options all at once (tests/muse_like.py, four layers: a stack
whose body is a RoPE sliding and a NoPE full layer, looped twice) decoded
through the kernel in strict interpret mode against the reference: logits,
greedy tokens (never a padding id) and every K/V cache. On 2 cores the
per-head norms and the output gate are each core's own heads, the gates and
the embedding norm replicated vector work after the all-reduces.

Tolerances are the check's own (against_reference.TOL, CACHE_TOL and, on a
bf16 wire, WIRE_TOL raised to the residual gate's WIRE_TOLERANCE, measured in
models/kind_residual_gate.py). Measured (2026-12-05, this file's seeds, as a
fraction of each bound): f32 on 1 core logits 0.053 and caches 0.29, on 2
cores 0.11 and 0.57 (1.0e-5 against 1.8e-5: f32 rounding, K/V of ~3.5);
bf16 on 2 cores 0.099 and 0.29; the drawn starts on 2 cores 0.21, 0.059 and
0.23; the gates without post norms on 2 cores 0.021 and 0.093; three steps
in one call on 1 core 0.12 and 0.39."""

import numpy as np
import pytest

from megakernel.backends.pallas_tpu.check.kernel_check import check as check_kernel
from megakernel.compiler.pipeline import plan_model
from megakernel.ir.config import build
from megakernel.testing import DecodeCase, check_case, kernel_cache
from tests.muse_like import muse_like

FOUR = dict(num_layers=4, layer_types=("sliding_attention", "full_attention") * 2)


def _checked(card, devices, tmp_path, batch=2, steps=1):
    model = build(card)
    if steps == 1:      # shared with the drawn cases below (kernel_cache)
        plan = kernel_cache.plan(model, devices, batch, 1)
        module = kernel_cache.kernel_module(model, plan)
    else:
        plan, module = plan_model(model, devices=devices, batch=batch, steps=steps), None
    result = check_kernel(model, plan, kernel_cache.weights(model, 5)[0], steps=2, seed=6,
                          module=module, out_dir=None if module else tmp_path)
    assert result.ok, result
    return model, plan


@pytest.mark.parametrize("devices", [1, 2])
def test_every_option_together_decodes_like_the_reference(devices, tmp_path):
    model, plan = _checked(muse_like(**FOUR), devices, tmp_path)
    stack = plan.shard.stacks[0]
    assert stack.param("l0_attn_residual.gate").dtype == "float32"
    if devices == 2:
        assert stack.param("l0_attn_residual.gate").splits == ()      # replicated
        # o_proj's partial sum is all-reduced before the post norm reads it
        assert "l0_post_attn_norm" in {r.consumer for r in stack.reductions}
        # the output gate's projection is split by heads, as the attention output is
        assert stack.width("l0_gate") == stack.width("l0_attn") == 2 * 64


def test_drawn_positions_share_the_kernel(tmp_path):
    """More starts through the 2-core kernel compiled above (one compile)."""
    model = build(muse_like(**FOUR))
    rng = np.random.default_rng(7)
    for start in ([0, 30], [12, 5], [40, 61]):
        case = DecodeCase(rng.integers(0, 512, (2, 62), dtype=np.int32),
                          np.array(start, np.int32), rng.integers(0, 512, (2, 1), dtype=np.int32))
        assert check_case(model, case, devices=2, seed=5).ok


def test_gates_read_the_all_reduced_branch_without_post_norms(tmp_path):
    card = muse_like(post_norms=False, post_norm_eps=None, post_attn_norm_weight=True,
                     post_ffn_norm_input_scaled=False)
    _, plan = _checked(card, 2, tmp_path)
    consumers = {r.consumer for s in plan.shard.stacks for r in s.reductions}
    assert {"attn_residual", "ffn_residual"} <= consumers


@pytest.mark.slow
def test_every_option_in_bfloat16_on_two_cores(tmp_path):
    _checked(muse_like(dtype="bfloat16", **FOUR), 2, tmp_path)


@pytest.mark.slow
def test_padding_ids_are_never_fed_back_over_several_steps(tmp_path):
    """Three greedy steps in one call: each step's argmax (a used id) is the next token."""
    _checked(muse_like(**FOUR), 1, tmp_path, steps=3)


@pytest.mark.aot
def test_every_option_compiles_for_tpu7x(tmp_path):
    """Mosaic takes the new lines: the gate's sqrt and sigmoids, parameter-free
    norms, the padding mask of the LM head (2 cores, bf16; 1.2 s)."""
    pytest.importorskip("libtpu")
    from megakernel.backends.pallas_tpu.aot.tpu_compile import aot_compile
    from megakernel.backends.pallas_tpu.codegen.load import compile_model

    model = build(muse_like(dtype="bfloat16", **FOUR))
    plan = plan_model(model, devices=2, batch=1, tokens=1)
    compile_model(model, plan, tmp_path)
    result = aot_compile(tmp_path, plan, topology="tpu7x:2x2x1")
    assert result.vmem_used_bytes is not None
    assert result.vmem_used_bytes <= result.vmem_limit_bytes
