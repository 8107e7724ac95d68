"""Graphs the card does not write: post-norms (a norm right after o_proj and
after the MLP, as Gemma 2/3 and OLMo 2 place them), the generic elementwise
ops, and final-logit soft-capping, decoded through the kernel on 1, 2 and 4
cores in strict interpret mode against the reference."""

import pytest

from megakernel.backends.pallas_tpu.aot.tpu_compile import aot_compile
from megakernel.backends.pallas_tpu.check.kernel_check import check as check_kernel
from megakernel.backends.pallas_tpu.codegen.load import compile_model
from megakernel.compiler.pipeline import plan_model
from megakernel.ir.config import LayerBuilder
from megakernel.ir.graph import Model
from megakernel.ir.kind_elementwise import Activate, ChannelScale, Mul, Scale, Softcap
from megakernel.ir.ops import MLP, Activation, Add, Attention, Linear, RMSNorm, Rope
from megakernel.models.weights import init_weights

H, HEADS, KV, D, V = 256, 4, 2, 64, 512


def post_norm_layer():
    b = LayerBuilder(H)
    hn = b.add("input_norm", lambda: RMSNorm(H), ("x",), "h")
    q = b.add("q_proj", lambda: Linear(H, HEADS * D), (hn,), "q")
    k = b.add("k_proj", lambda: Linear(H, KV * D), (hn,), "k")
    v = b.add("v_proj", lambda: Linear(H, KV * D), (hn,), "v")
    q = b.add("q_rope", lambda: Rope(HEADS, D), (q,), "q_rot")
    k = b.add("k_rope", lambda: Rope(KV, D), (k,), "k_rot")
    a = b.add("attention", lambda: Attention(HEADS, KV, D), (q, k, v), "attn")
    a = b.add("o_proj", lambda: Linear(HEADS * D, H), (a,), "attn_out")
    a = b.add("post_attn_norm", lambda: RMSNorm(H, offset=True), (a,), "attn_normed")
    x = b.add("attn_residual", Add, ("x", a), "x_mid")
    hn = b.add("pre_ffn_norm", lambda: RMSNorm(H), (x,), "h2")
    f = b.add("mlp", lambda: MLP(H, 512, Activation.GELU_TANH), (hn,), "f")
    f = b.add("post_ffn_norm", lambda: RMSNorm(H), (f,), "f_normed")
    gate = b.add("gate_act", lambda: Activate(Activation.SIGMOID), (x,), "g")
    f = b.add("gate_mul", Mul, (f, gate), "f_gated")
    f = b.add("layer_scale", lambda: ChannelScale(H), (f,), "f_scaled")
    f = b.add("half", lambda: Scale(0.5), (f,), "f_half")
    f = b.add("ffn_cap", lambda: Softcap(20.0), (f,), "f_capped")
    return b.layer("post_norm", b.add("ffn_residual", Add, (x, f), "y"))


def model(dtype="float32"):
    layer = post_norm_layer()
    return Model("post-norm", V, H, (layer, layer), RMSNorm(H), dtype=dtype, max_seq_len=64,
                 logit_ops=(Softcap(1.5),))


@pytest.mark.parametrize("devices, dtype", [(1, "float32"), (2, "bfloat16"), (4, "float32")])
def test_post_norm_graph_with_generic_ops_decodes(devices, dtype, tmp_path):
    m = model(dtype)
    plan = plan_model(m, devices=devices, batch=2, tokens=1)
    if devices > 1:        # the norms after o_proj and the MLP read all-reduced sums
        consumers = {r.consumer for r in plan.shard.stacks[0].reductions}
        assert {"post_attn_norm", "post_ffn_norm"} <= consumers
    result = check_kernel(m, plan, init_weights(m, seed=3), steps=2, seed=4, out_dir=tmp_path)
    assert not result.races and result.token_agreement == 1.0, result
    assert result.max_abs_err <= result.tolerance, result


@pytest.mark.aot
def test_post_norm_graph_compiles_for_tpu7x(tmp_path):
    pytest.importorskip("libtpu")
    m = model("bfloat16")
    plan = plan_model(m, devices=2, batch=1, tokens=1)
    compile_model(m, plan, tmp_path)
    result = aot_compile(tmp_path, plan, topology="tpu7x:2x2x1")
    assert result.vmem_used_bytes is not None and result.vmem_used_bytes <= result.vmem_limit_bytes
