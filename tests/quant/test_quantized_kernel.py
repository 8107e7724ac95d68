"""Quantized weights through the generated kernel: strict interpret mode (race
detector on) against the reference, which dequantises with the same
arithmetic (megakernel/quantize.py), and trace mode's bytes against the plan."""

import numpy as np
import pytest

from megakernel import quantize
from megakernel.backends.pallas_tpu.check import trace_dmas as trace
from megakernel.backends.pallas_tpu.check.kernel_check import check
from megakernel.compiler.pipeline import plan_model
from megakernel.compiler.shard import shard_weights
from megakernel.errors import PlanningError
from megakernel.ir.config import ModelConfig, MoEConfig, build
from megakernel.ir.weight_kinds import Quantize
from megakernel.models.weights import init_weights


def model(fmt: str, moe: bool = False, experts: str = "plain", **kw):
    base = dict(name="q_moe" if moe else "q_dense", vocab_size=512, hidden_size=128,
                num_layers=3 if moe else 2, num_q_heads=4, num_kv_heads=2, head_dim=128,
                intermediate_size=256, max_seq_len=64, dtype="bfloat16",
                quantize=Quantize(dense=fmt, experts=experts))
    if moe:    # its dense weights: attention projections, the dense layer, the shared expert
        base.update(first_k_dense=1, moe=MoEConfig(
            num_experts=4, top_k=2, expert_intermediate=256, scoring="sigmoid",
            correction_bias=True, renormalize=True, num_shared_experts=1,
            shared_intermediate=128))
    return build(ModelConfig(**{**base, **kw}))


# Few and small (each is one interpret-mode compile, 5-30 s): every format
# once, dense and routed experts, 1, 2 and 4 devices, experts fetched whole and
# in two slices, and ring tiles cut to the smallest scale slices Mosaic takes
# (16 KiB banks: fp8 blocks of one scale row; int4_g64 expert slices of two).
# Measured with int4 on the float8 path (exact products, its offset taken off
# by rowsum(x_g); 2 steps, libtpu-free interpret mode): int4_g32 on 1 core
# 9.5e-7 max logit error; int4_g32 dense + mxfp4 experts on 2 cores 1.2e-2,
# int4_g128 on 2 cores 1.2e-2, int4_g32 dense and experts on 4 cores 9.4e-3,
# fp8_b128 + int4_g64 experts on 1 core 9.2e-3, int8 dense + nvfp4 experts on
# 2 cores 1.1e-2 (tolerance 0.13), each with one bf16 ulp (0.0156)
# of cache difference: a k/v value whose f32 sum order decided its bf16
# rounding (the same cases through int4's bf16 decode: 4.8e-7, 9.9e-3,
# 9.4e-3, -, 7.3e-3, the same one-ulp cache flips). Under the check's bf16
# tolerance (8.7e-2 to 9.9e-2 here).
SMALL = {"bank_bytes": 16 * 1024, "slot_chunks": 2}
CASES = [("int8", "plain", False, 1, None), ("int4_g32", "mxfp4", True, 2, None),
         ("mxfp4", "plain", False, 2, None), ("plain", "int8", True, 1, {"slot_chunks": 2}),
         ("int4_g32", "int4_g32", True, 4, None), ("int8", "nvfp4", True, 2, None),
         pytest.param("fp8_b128", "int4_g64", True, 1, SMALL, marks=pytest.mark.slow),
         pytest.param("int4_g128", "plain", False, 2, None, marks=pytest.mark.slow)]


@pytest.mark.parametrize("fmt, experts, moe, devices, overrides", CASES)
def test_kernel_equals_reference_on_quantized_weights(fmt, experts, moe, devices, overrides):
    m = model(fmt, moe, experts)
    plan = plan_model(m, devices=devices, batch=2, overrides=overrides)
    formats_used = {p.format for ss in plan.shard.stacks for p in ss.params}
    assert formats_used >= {fmt, experts} - {"plain"}
    slices = (overrides or {}).get("slot_chunks")
    assert not slices or all(e.chunks == slices for e in plan.memory.experts)
    if overrides == SMALL:       # one-row fp8 scale slices in the ring
        assert {t.scale_view[0] for s in plan.memory.stream.stacks for t in s.tiles
                if t.format == fmt} == {1}
    result = check(m, plan, init_weights(m, 0), steps=2)
    assert not result.races
    assert result.token_agreement == 1.0
    assert result.max_abs_err <= result.tolerance, result.errors
    assert result.cache_max_err <= result.cache_tolerance


@pytest.mark.parametrize("fmt", ["int4_g64", pytest.param("fp8_b128", marks=pytest.mark.slow)])
def test_a_step_moves_the_packed_bytes_the_plan_counts(fmt, tmp_path):
    m = model(fmt)
    plan = plan_model(m, devices=2, batch=2)
    weights = init_weights(m)
    result = trace.trace_step(m, plan, weights, out_dir=tmp_path)
    want = trace.plan_weight_bytes(plan)
    shards = shard_weights(m, plan.shard, weights)
    for core in range(2):
        got = result.bytes_by_kind(core)
        assert got["ring"] == want["ring"]
        # independently: the packed codes' words and f32 scales of every
        # quantized weight, once per row block for per-channel scales
        codes = sum(quantize.to_words(a).nbytes for a in shards[core].values()
                    if isinstance(a, quantize.Packed))
        scales = sum(a.scales.nbytes for a in shards[core].values()
                     if isinstance(a, quantize.Packed))
        plain = sum(a.nbytes for k, a in shards[core].items()
                    if not isinstance(a, quantize.Packed) and not k.endswith("_scale")
                    and k not in ("embed.weight", "final_norm.weight"))
        assert got["ring"] + got["vector"] == codes + scales + plain
    bf16 = plan_model(model("plain"), devices=2, batch=2)
    assert want["ring"] < 0.75 * trace.plan_weight_bytes(bf16)["ring"]


def test_formats_on_channels_without_a_kernel_path_are_named():
    """Only the ring and the expert slots stream quantized weights; every kind a
    card can quantize reaches one of them (the embedding and the router are
    refused as kinds, formats.PLAIN_ONLY), so this guards the planner itself."""
    from megakernel.compiler.shard_formats import format_params
    from megakernel.compiler.shard_rules import ParamShard

    vector = ParamShard("w", (128, 128), "bfloat16", (), "vector", "replicated")
    with pytest.raises(PlanningError, match="reaches VMEM by 'vector'"):
        format_params((vector,), {"w": "int8"}, "shard")


@pytest.mark.parametrize("fmt", ["int4_g32", "int4_g64", "int4_g128"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_int4_on_the_float8_path_is_exact_up_to_f32_sums(fmt, dtype):
    """dequant.matmul's float8 path for int4 (u = c + 8 as e4m3 bytes u x 2^-9,
    the offset off by rowsum(x_g)) against sum_g (x_g @ c_g) s_g in float64,
    every code -8..7, x with mean 1 (the offset's cancellation at its worst
    here). Measured here: 0.8e-7 to 2.3e-7 of max |y| over g32 / g64 / g128,
    bf16 and f32 models; at most 6.1e-7 with K 1024 and quantized Gaussian
    weights (the bf16 decode path there: 1.3e-3 to 1.6e-3, its weights
    rounded to bf16). The bound is 2e-6."""
    import jax
    import jax.numpy as jnp
    import ml_dtypes
    from jax.experimental import pallas as pl

    from megakernel import formats
    from megakernel.backends.pallas_tpu.kernels import dequant
    from megakernel.backends.pallas_tpu.kernels import blocks as runtime

    f, (k, n) = formats.get(fmt), (512, 256)
    rng = np.random.default_rng(0)
    codes = rng.integers(-8, 8, (k, n)).astype(np.int8)
    codes[:16, 0] = np.arange(-8, 8)
    scales = rng.uniform(0.5, 2.0, (k // f.group(k), n)).astype(ml_dtypes.bfloat16)
    p = quantize.Packed(f, codes, scales.astype(np.float32), dtype)
    x = (rng.standard_normal((8, k)) + 1.0).astype(ml_dtypes.bfloat16).astype(np.float32)
    exact = x.astype(np.float64) @ (codes * np.repeat(p.scales, p.group(), 0).astype(np.float64))

    def kernel(x_ref, w_ref, s_ref, o_ref):
        o_ref[...] = dequant.matmul(x_ref[...], w_ref, s_ref[...], fmt, jnp.dtype(dtype),
                                    runtime.matmul)

    y = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((8, n), jnp.float32),
                       interpret=True)(jnp.asarray(x), jnp.asarray(quantize.to_words(p)),
                                       jnp.asarray(p.scales))
    assert f.mxu == "fp8"
    assert np.abs(np.asarray(y, np.float64) - exact).max() <= 2e-6 * np.abs(exact).max()
