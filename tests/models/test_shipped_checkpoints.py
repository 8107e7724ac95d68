"""Pre-quantized checkpoints loaded as shipped (models/shipped.py,
models/shipped_view.py), against tiny checkpoints written by an independent
numpy writer (tests/models/shipped_writers.py):

(a) every loaded ``Packed`` decodes (``quantize.dequantize_packed``) to exactly
    the writer's numpy dequantization, as the float loader orients it (the
    "twin" checkpoint holds those values as f32);
(b) on the same bf16 weights, shipped codes equal quantize-on-load's codes, so
    the reference's logits are equal: measured max |difference| 0.0;
(c) malformed configs and tensors are named errors.
"""

import dataclasses
import json
import time

import jax.numpy as jnp
import numpy as np
import pytest

from megakernel import quantize
from megakernel.errors import ConfigError
from megakernel.ir.config import build
from megakernel.models import reference as R
from megakernel.models import shipped
from megakernel.models.checkpoint import load_checkpoint
from megakernel.models.hf import from_hf
from tests.cli.helpers import run
from tests.models import shipped_writers as W

CT = {"quant_method": "compressed-tensors", "format": "pack-quantized",
      "quantization_status": "compressed"}


def ct_group(targets, fmt="pack-quantized", bits=4, group=32, strategy="group",
             kind="int", **weights):
    return {"targets": targets, "format": fmt,
            "weights": {"num_bits": bits, "type": kind, "symmetric": True,
                        "group_size": group, "strategy": strategy, **weights}}


def layouts(names, layout):
    return dict.fromkeys(names, layout)


@pytest.fixture(scope="module")
def deepseek(tmp_path_factory):
    """(shipped fp8 folder, its dequantized twin, the same bf16 weights unquantized
    but for kv_b_proj, which the IR reads plain: its dequantized values)."""
    root = tmp_path_factory.mktemp("deepseek")
    tensors, linears = W.deepseek_tensors(np.random.default_rng(0))
    out, twin = W.ship(tensors, layouts(linears, "fp8"))
    floats = {k: twin[k] if "kv_b_proj" in k else v for k, v in tensors.items()}
    return (W.write(root / "fp8", {**W.DEEPSEEK, "quantization_config": W.FP8}, out),
            W.write(root / "twin", W.DEEPSEEK, twin), W.write(root / "bf16", W.DEEPSEEK, floats))


def _decoded_equal(weights, twin):
    """(a): each weight as the reference sees it equals the twin's, bit for bit."""
    for name, w in weights.items():
        got = quantize.dequantize_packed(w) if isinstance(w, quantize.Packed) else w
        assert np.array_equal(np.asarray(got, np.float32), twin[name].astype(np.float32)), name


def _logits(model, weights):
    ids = jnp.asarray([[3, 17, 250, 9], [41, 5, 77, 128]], jnp.int32)
    logits, _ = R.decode_step(model, R.as_jax(weights), ids, jnp.zeros(2, jnp.int32),
                              R.init_caches(model, 2))
    return np.asarray(logits)


def _same_as_quantize_on_load(model, shipped_weights, float_folder):
    """(b): quantize-on-load of the same bf16 weights gives the same codes and
    scales, hence the same logits (measured difference: 0.0)."""
    rounded = load_checkpoint(float_folder, model)
    packed = [k for k, v in shipped_weights.items() if isinstance(v, quantize.Packed)]
    assert packed
    for k in packed:
        a, b = shipped_weights[k], rounded[k]
        assert a.fmt == b.fmt and np.array_equal(a.codes, b.codes), k
        assert np.array_equal(a.scales, b.scales), k
    assert np.array_equal(_logits(model, shipped_weights), _logits(model, rounded))


def test_deepseek_fp8_loads_as_shipped(deepseek):
    fp8, twin, bf16 = deepseek
    card = from_hf(fp8)
    assert card.quantize.chosen() == {"dense": "fp8_b128", "experts": "fp8_b128"}
    model = build(card)
    weights = load_checkpoint(fp8, model)
    packed = {k for k, v in weights.items() if isinstance(v, quantize.Packed)}
    # every linear of the layers but MLA's up-projections (w_uk / w_uv, read plain)
    assert packed == {k for k, s in model.params().items() if s.format == "fp8_b128"}
    assert {k.split(".", 2)[2] for k in packed} >= {
        "q_a_proj.weight", "q_b_proj.weight", "kv_a_proj.weight", "o_proj.weight",
        "mlp.gate", "moe.experts_down", "moe.shared_up"}
    _decoded_equal(weights, load_checkpoint(twin))
    _same_as_quantize_on_load(model, weights, bf16)


QWEN_MOE_INT4 = {**CT, "config_groups": {"group_0": ct_group(["Linear"], group=32)},
                 "ignore": ["lm_head", "re:.*mlp\\.gate$"]}
QWEN_MOE_MIXED = {**CT, "format": "mixed-precision", "config_groups": {
    "attention": ct_group(["re:.*self_attn\\..*_proj$"], group=128),
    "experts": ct_group(["re:.*mlp\\.experts\\..*"], fmt="mxfp4-pack-quantized", kind="float",
                        scale_dtype="torch.uint8")}}


QWEN_MOE_NVFP4 = {**CT, "format": "mixed-precision", "config_groups": {
    "attention": ct_group(["re:.*self_attn\\..*_proj$"], bits=8, group=None,
                          strategy="channel"),
    "experts": ct_group(["re:.*mlp\\.experts\\..*"], fmt="nvfp4-pack-quantized",
                        kind="float", group=16, strategy="tensor_group",
                        scale_dtype="torch.float8_e4m3fn")}}


def _int8_attention_nvfp4_experts(name):
    if ".self_attn." in name and name.endswith("proj.weight"):
        return "int8"
    return "nvfp4" if ".mlp.experts." in name else None


def _int4_g32_but_router(name):
    return "int4_g32" if name.endswith("proj.weight") else None


def _int4_g128_attention_mxfp4_experts(name):
    if ".self_attn." in name and name.endswith("proj.weight"):
        return "int4_g128"
    return "mxfp4" if ".mlp.experts." in name else None


@pytest.mark.parametrize("config, pick, table, logits", [
    (QWEN_MOE_INT4, _int4_g32_but_router, {"dense": "int4_g32", "experts": "int4_g32"}, True),
    (QWEN_MOE_MIXED, _int4_g128_attention_mxfp4_experts,
     {"dense": "int4_g128", "experts": "mxfp4"}, False),
    # the Muse Spark configuration's formats: int8 attention, NVFP4 experts,
    # each expert with its own global scale
    (QWEN_MOE_NVFP4, _int8_attention_nvfp4_experts,
     {"dense": "int8", "experts": "nvfp4"}, True),
], ids=["int4_g32", "int4_g128+mxfp4", "int8+nvfp4"])
def test_compressed_tensors_load_as_shipped(tmp_path, config, pick, table, logits):
    tensors = W.qwen3_tensors(np.random.default_rng(1), W.QWEN3_MOE)
    chosen = {k: pick(k) for k in tensors if pick(k)}
    assert len(chosen) == 2 * (4 + 3 * 4)       # no router, no lm_head
    out, twin = W.ship(tensors, chosen)
    folder = W.write(tmp_path / "q", {**W.QWEN3_MOE, "quantization_config": config}, out)
    card = from_hf(folder)
    assert card.quantize.chosen() == table
    model = build(card)
    weights = load_checkpoint(folder, model)
    _decoded_equal(weights, load_checkpoint(W.write(tmp_path / "twin", W.QWEN3_MOE, twin)))
    floats = W.write(tmp_path / "bf16", W.QWEN3_MOE, tensors)
    if logits:
        _same_as_quantize_on_load(model, weights, floats)
    else:   # codes alone: the logits follow from them, as in the int4_g32 case
        rounded = load_checkpoint(floats, model)
        for k, v in weights.items():
            if isinstance(v, quantize.Packed):
                assert np.array_equal(v.codes, rounded[k].codes), k


@pytest.mark.parametrize("targets, layout, table", [
    (["Linear"], "int8", {"dense": "int8"}),
    # only the MLP ships quantized: dense is mixed, so it stays plain and the
    # MLP is dequantized on load (what HF computes with)
    (["re:.*mlp.*"], "int4_g64", {}),
])
def test_kind_format_follows_the_shipped_modules(tmp_path, targets, layout, table):
    bits, group, strategy = (8, None, "channel") if layout == "int8" else (4, 64, "group")
    config = {**CT, "config_groups": {"g": ct_group(targets, bits=bits, group=group,
                                                    strategy=strategy)},
              "ignore": ["lm_head"]}
    tensors = W.qwen3_tensors(np.random.default_rng(2), W.QWEN3)
    chosen = {k: layout for k in tensors if k.endswith("proj.weight")
              and (targets == ["Linear"] or ".mlp." in k)}
    out, twin = W.ship(tensors, chosen)
    folder = W.write(tmp_path / "q", {**W.QWEN3, "quantization_config": config}, out)
    card = from_hf(folder)
    assert card.quantize.chosen() == table
    weights = load_checkpoint(folder)
    assert any(isinstance(v, quantize.Packed) for v in weights.values()) == bool(table)
    _decoded_equal(weights, load_checkpoint(W.write(tmp_path / "twin", W.QWEN3, twin)))


def test_packing_order_is_compressed_tensors():
    """Hand-made words: codes 0..7 of one row are the nibbles 8..15 from the
    low end (0xFEDCBA98); mxfp4 byte 0x21 holds column 0 = e2m1 code 1 (low
    nibble) and column 1 = code 2."""
    int4 = shipped.read({**CT, "config_groups": {"g": ct_group(["Linear"])}}).groups[0].layout
    word = np.array([[np.uint32(0xFEDCBA98).view(np.int32)]])
    assert int4.unpack(word, 8).tolist() == [list(range(8))]
    assert int4.unpack(np.array([[0x76543210]], np.int32), 8).tolist() == [list(range(-8, 0))]
    mx = shipped.read({**CT, "config_groups": {"g": ct_group(
        ["Linear"], fmt="mxfp4-pack-quantized", kind="float")}}).groups[0].layout
    assert mx.unpack(np.array([[0x21]], np.uint8), 2).tolist() == [[1, 2]]


@pytest.mark.parametrize("qc, needle", [
    ({"quant_method": "awq"}, "quant_method: 'awq' is not supported"),
    ({**W.FP8, "weight_block_size": [64, 64]}, "weight_block_size: found [64, 64]"),
    ({**W.FP8, "fmt": "e5m2"}, "fmt: found 'e5m2', expected 'e4m3'"),
    ({**CT, "config_groups": {"g": ct_group(["Linear"], fmt="nvfp4-pack-quantized")}},
     "format='nvfp4-pack-quantized'"),
    ({**CT, "config_groups": {"g": ct_group(["Linear"], fmt="nvfp4-pack-quantized",
                                            kind="float", strategy="tensor_group")}},
     "group_size: found 32, expected one of (16,)"),
    ({**CT, "config_groups": {"g": {**ct_group(["Linear"], fmt="nvfp4-pack-quantized",
                                               kind="float", group=16, strategy="tensor_group"),
                                    "input_activations": {"num_bits": 4, "type": "float"}}}},
     "input_activations"),
    ({**CT, "config_groups": {"g": ct_group(["Linear"], bits=2)}}, "num_bits=2"),
    ({**CT, "config_groups": {"g": ct_group(["Linear"], group=16)}},
     "group_size: found 16, expected one of (32, 64, 128)"),
    ({**CT, "config_groups": {"g": {**ct_group(["Linear"]), "weights": {
        **ct_group(["Linear"])["weights"], "symmetric": False}}}}, "symmetric: found False"),
    ({**CT, "quantization_status": "frozen", "config_groups": {"g": ct_group(["Linear"])}},
     "quantization_status: found 'frozen'"),
    ({**CT, "config_groups": {"g": ct_group(["Qwen3MLP"])}}, "class name 'Qwen3MLP'"),
    # patterns: one Python's re refuses (was re.error) and one RE2 does not read
    ({**CT, "config_groups": {"g": ct_group(["Linear"])}, "ignore": ["lm_head", "re:("]},
     "quantization_config.ignore[1]: 're:(' is not a regular expression"),
    ({**CT, "config_groups": {"g": ct_group(["re:(?<=x)y"])}},
     "config_groups.g.targets[0]: 're:(?<=x)y' is not a regular expression"),
])
def test_unsupported_configs_are_named(qc, needle):
    with pytest.raises(ConfigError) as info:
        from_hf({**W.QWEN3, "quantization_config": qc})
    assert "quantization_config." in str(info.value) and needle in str(info.value)


def _fp8_dense(tmp_path, edit):
    """A tiny fp8 qwen3 checkpoint, its tensors changed by ``edit(tensors)``."""
    tensors = W.qwen3_tensors(np.random.default_rng(3), {**W.QWEN3, "num_hidden_layers": 1})
    out, _ = W.ship(tensors, layouts([k for k in tensors if k.endswith("proj.weight")], "fp8"))
    edit(out)
    return W.write(tmp_path / "q", {**W.QWEN3, "num_hidden_layers": 1,
                                    "quantization_config": W.FP8}, out)


def _packed_dense(tmp_path, layout, edit):
    tensors = W.qwen3_tensors(np.random.default_rng(4), {**W.QWEN3, "num_hidden_layers": 1})
    out, _ = W.ship(tensors, layouts([k for k in tensors if k.endswith("proj.weight")], layout))
    edit(out)
    group = {"mxfp4": ct_group(["Linear"], fmt="mxfp4-pack-quantized", kind="float"),
             "nvfp4": ct_group(["Linear"], fmt="nvfp4-pack-quantized", kind="float", group=16,
                               strategy="tensor_group")}.get(layout, ct_group(["Linear"]))
    return W.write(tmp_path / "q", {**W.QWEN3, "num_hidden_layers": 1, "quantization_config": {
        **CT, "config_groups": {"g": group}, "ignore": ["lm_head"]}}, out)


Q = "model.layers.0.self_attn.q_proj."


def _set(name, index, value):
    def edit(t):
        t[name] = t[name].copy()
        t[name][index] = value
    return edit


@pytest.mark.parametrize("make, needle", [
    (lambda p: _fp8_dense(p, _set(Q + "weight_scale_inv", (0, 0), 0.0)),
     Q + "weight_scale_inv: 1 zero, NaN or infinite scales"),
    (lambda p: _fp8_dense(p, _set(Q + "weight_scale_inv", (0, 0), np.nan)),
     Q + "weight_scale_inv: 1 zero, NaN or infinite scales (first at [0, 0]: nan)"),
    (lambda p: _fp8_dense(p, _set(Q + "weight_scale_inv", (0, 0), np.inf)),
     Q + "weight_scale_inv: 1 zero, NaN or infinite scales"),
    (lambda p: _fp8_dense(p, _set(Q + "weight", (5, 5), np.nan)),
     Q + "weight: float8 e4m3 codes hold NaN"),
    (lambda p: _fp8_dense(p, lambda t: t.pop(Q + "weight_scale_inv")),
     Q + "weight_scale_inv is missing"),
    (lambda p: _fp8_dense(p, lambda t: t.update(
        {Q + "weight_scale_inv": np.ones((2, 2), np.float32)})),
     Q + "weight_scale_inv: scales have shape (2, 2), expected (1, 1)"),
    (lambda p: _packed_dense(p, "mxfp4", _set(Q + "weight_scale", (0, 0), 0)),
     Q + "weight_scale: 1 E8M0 bytes 0 or 255"),
    (lambda p: _packed_dense(p, "mxfp4", _set(Q + "weight_scale", (3, 1), 255)),
     Q + "weight_scale: 1 E8M0 bytes 0 or 255 (first at [3, 1]: 255)"),
    (lambda p: _packed_dense(p, "nvfp4", lambda t: t.pop(Q + "weight_global_scale")),
     Q + "weight_global_scale is missing: nvfp4 block scales need the module's global scale"),
    (lambda p: _packed_dense(p, "nvfp4", _set(Q + "weight_global_scale", 0, 0.0)),
     Q + "weight_global_scale: global scale 0.0 is not a finite positive number"),
    (lambda p: _packed_dense(p, "nvfp4", _set(Q + "weight_scale", (2, 5), np.nan)),
     Q + "weight_scale: 1 NaN or negative e4m3 block scales (first at [2, 5]: nan)"),
    (lambda p: _packed_dense(p, "nvfp4", lambda t: t.update(
        {Q + "weight_global_scale": np.ones(1, np.float16)})),
     Q + "weight_global_scale (global scale) is stored as F16"),
    (lambda p: _packed_dense(p, "int4_g32", lambda t: t.update(
        {Q + "weight_shape": np.array([128, 124], np.int64)})),
     "has shape [128, 124], expected [128, 128] (the [out, in] of " + Q + "weight is its "
     "codes' shape (and weight_shape tensor))"),
    (lambda p: _packed_dense(p, "int4_g32", lambda t: t.update(
        {Q + "weight_shape": np.array([128, 64], np.int64)})),
     Q + "weight_shape is [128, 64], but " + Q + "weight_packed [128, 16]"),
    (lambda p: _packed_dense(p, "int4_g32", lambda t: t.pop(Q + "weight_shape")),
     Q + "weight_shape is missing"),
    (lambda p: _packed_dense(p, "int4_g32", lambda t: t.update(
        {Q + "weight_packed": t[Q + "weight_packed"].astype(np.float32)})),
     Q + "weight_packed (codes) is stored as F32"),
    (lambda p: _packed_dense(p, "int4_g32", lambda t: t.update(
        {Q + "weight": np.ones((128, 128), np.float32)}) or t.pop(Q + "weight_packed")),
     Q + "weight_packed is missing: quantization_config makes " + Q[:-1] + " int4_g32"),
])
def test_malformed_tensors_are_named(tmp_path, make, needle):
    folder = make(tmp_path)
    with pytest.raises(ConfigError) as info:
        load_checkpoint(folder)
    assert needle in str(info.value), str(info.value)


def test_tensors_that_disagree_with_the_config_are_named(tmp_path):
    """The config says float but the module ships fp8; one stacked experts
    weight whose experts are partly ignored (the card leaves experts plain:
    asking int4_g32 for them names the expert that ships as a float)."""
    folder = _fp8_dense(tmp_path / "a", lambda t: None)
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"]["modules_to_not_convert"] = ["q_proj"]
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match=Q + "weight is stored as F8_E4M3"):
        load_checkpoint(folder)
    one = {**W.QWEN3_MOE, "num_hidden_layers": 1}
    tensors = W.qwen3_tensors(np.random.default_rng(5), one)
    skip = "model.layers.0.mlp.experts.2.up_proj"
    out, _ = W.ship(tensors, {k: "int4_g32" for k in tensors
                              if k.endswith("proj.weight") and not k.startswith(skip)})
    folder = W.write(tmp_path / "b", {**one, "quantization_config": {
        **CT, "config_groups": {"g": ct_group(["Linear"])},
        "ignore": ["lm_head", "re:.*mlp\\.gate$", skip]}}, out)
    model = build(from_hf(folder))
    assert model.quantize.chosen() == {"dense": "int4_g32"}
    asked = dataclasses.replace(model, quantize=dataclasses.replace(model.quantize,
                                                                    experts="int4_g32"))
    with pytest.raises(ConfigError, match="layers.0.moe.experts_up: one weight from tensors "
                                          "of which .* ship quantized and .*experts.2.up_proj"):
        load_checkpoint(folder, asked)


def test_a_second_rounding_is_refused(tmp_path):
    """--quantize dense=int8 over an fp8 checkpoint would round its codes again."""
    folder = _fp8_dense(tmp_path, lambda t: None)
    model = build(from_hf(folder))
    other = dataclasses.replace(model, quantize=dataclasses.replace(model.quantize, dense="int8"))
    with pytest.raises(ConfigError, match="ships as fp8_b128 .* rounded a second time"):
        load_checkpoint(folder, other)


def test_a_catastrophic_pattern_is_matched_at_once():
    """``re:(.*)*x`` backtracks exponentially in Python's re (a 24-character
    name took ~6 s, the model's names hung compile past 120 s); RE2 is linear."""
    config = {**CT, "config_groups": {"g": ct_group(["re:(.*)*x"])}}
    start = time.perf_counter()
    assert shipped.read(config).layout_of("model.layers.0.mlp.gate_", "dense") is None
    assert time.perf_counter() - start < 2
    assert from_hf({**W.QWEN3, "quantization_config": config}).quantize.chosen() == {}
    assert time.perf_counter() - start < 2


def test_the_cli_names_a_bad_quantization_config(tmp_path, capsys):
    folder = W.write(tmp_path / "q", {**W.QWEN3, "quantization_config": {
        **CT, "config_groups": {"g": ct_group(["Linear"], group=256)}}}, {})
    code, _, err = run("show", str(folder), capsys=capsys)
    assert code == 2 and "group_size: found 256" in " ".join(err.split())


@pytest.mark.slow
def test_shipped_fp8_deepseek_through_the_kernel(deepseek):
    """The fp8 checkpoint on one core in strict interpret mode against the
    reference (~13 s). Measured: max logit error 2.4e-7, caches equal."""
    from megakernel.backends.pallas_tpu.check.kernel_check import check
    from megakernel.compiler.pipeline import plan_model

    model = build(from_hf(deepseek[0]))
    result = check(model, plan_model(model, devices=1, batch=2),
                   load_checkpoint(deepseek[0], model), steps=2)
    assert not result.races and result.token_agreement == 1.0
    assert result.max_abs_err <= result.tolerance and result.cache_max_err <= result.cache_tolerance
