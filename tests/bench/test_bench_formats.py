"""The bench's weight-format rows: each quantized variant planned beside its
bf16 row (bench/formats.py); every figure modeled."""

from megakernel.compiler.pipeline import plan_model
from megakernel.models import zoo

from bench import formats


def test_a_format_row_stands_beside_its_bf16_row():
    rec = formats.format_record("qwen3-8b", 4, {"dense": "int4_g128"})
    assert rec["formats"] == "dense int4_g128" and rec["bf16_cores"] == 4
    # the bf16 row is the zoo model's own plan on the same cores
    bf16 = plan_model(zoo.model("qwen3-8b"), devices=4, batch=1, tokens=1)
    assert rec["bf16_modeled_step_ms"] == bf16.cost.step_ms
    # a quarter of the dense bytes, and the codes reach the MXU as float8 at
    # twice bf16's rate (docs/formats.md): the HBM floor still binds, and the
    # step models below bf16's (0.802 against 1.150 ms; through the bf16
    # decode the core floor bound, 0.863 against 0.357 ms, and it modeled 1.450)
    assert rec["modeled_core_floor_ms"] < rec["modeled_hbm_floor_ms"]
    assert rec["modeled_binding_floor"] == "hbm"
    assert rec["modeled_step_ms"] < rec["bf16_modeled_step_ms"]
    text = "\n".join(formats.render([rec]))
    assert "MODELED" in text and "dense int4_g128" in text and "qwen3-8b/4" in text


def test_a_model_bf16_does_not_fit_is_compared_on_more_cores():
    rec = formats.format_record("kimi-k2", 16, {"experts": "mxfp4"})
    assert rec["bf16_cores"] == 32 and rec["bf16_note"].startswith("bf16 on 16 cores:")
    assert rec["hbm_bytes_per_core"] < 103e9        # TPU7x HBM per TensorCore
    assert "kimi-k2/32" in "\n".join(formats.render([rec]))
