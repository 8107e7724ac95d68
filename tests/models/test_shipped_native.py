"""Checkpoints in the layouts their producers ship, beyond compressed-tensors
repacks (issue 33), against tiny checkpoints written by the independent numpy
writer (tests/models/shipped_writers.py):

* gpt-oss as OpenAI ships it (``quant_method: mxfp4``, experts as
  ``*_blocks`` / ``*_scales``): the experts load as mxfp4 codes, byte for
  byte the writer's, decode to its numpy dequantization, and equal
  quantize-on-load's codes of the same bf16 weights, so the reference's
  logits are equal;
* a weight whose shipped format the kernel cannot hold (DeepSeek fp8 with
  ``in`` not a multiple of 128, a partial last block; mxfp4 experts of 96
  inputs, not whole 64-row code tiles) loads dequantized: its kind stays
  plain, with one note, and its values equal the writer's exactly.
"""

import numpy as np
import pytest

from megakernel import quantize
from megakernel.errors import ConfigError
from megakernel.ir.config import build
from megakernel.models import shipped, shipped_view
from megakernel.models.checkpoint import load_checkpoint
from megakernel.models.hf import from_hf
from tests.cli.helpers import run
from tests.models import shipped_writers as W
from tests.models.test_shipped_checkpoints import _decoded_equal, _logits, \
    _same_as_quantize_on_load


def _gpt_oss(root, config):
    tensors = W.gpt_oss_tensors(np.random.default_rng(7), config)
    experts = {k: "gpt_oss_mxfp4" for k in tensors if k.endswith(("gate_up_proj", "down_proj"))}
    out, twin = W.ship(tensors, experts)
    return (W.write(root / "mxfp4", {**config, "quantization_config": W.GPT_OSS_MXFP4}, out),
            W.write(root / "twin", config, twin), W.write(root / "bf16", config, tensors), out)


def _values_equal(weights, twin):
    """Each weight's values (packed: codes x scales, decoded in numpy) equal
    the twin's, which the writer dequantized; bf16 holds both exactly."""
    for name, w in weights.items():
        if isinstance(w, quantize.Packed):
            w = quantize.decode_np(w) * np.repeat(w.scales, w.group(), axis=-2)
        assert np.array_equal(np.asarray(w, np.float32), twin[name].astype(np.float32)), name


@pytest.fixture(scope="module")
def gpt_oss(tmp_path_factory):
    return _gpt_oss(tmp_path_factory.mktemp("gpt_oss"), W.GPT_OSS)


def test_gpt_oss_mxfp4_loads_as_shipped(gpt_oss):
    folder, twin, bf16, out = gpt_oss
    card = from_hf(folder)
    assert card.quantize.chosen() == {"experts": "mxfp4"}
    model = build(card)
    weights = load_checkpoint(folder, model)
    packed = {k for k, v in weights.items() if isinstance(v, quantize.Packed)}
    assert packed == {f"layers.{i}.moe.experts_{p}" for i in (0, 1) for p in ("gate", "up", "down")}
    # The codes are the shipped nibbles: gate is gate_up's even output rows.
    blocks = out["model.layers.1.mlp.experts.gate_up_proj_blocks"]         # [E, 2I, H/32, 16]
    nib = np.stack([blocks & 0xF, blocks >> 4], axis=-1).reshape(*blocks.shape[:2], -1)
    gate = weights["layers.1.moe.experts_gate"]
    assert np.array_equal(gate.codes, nib[:, 0::2].transpose(0, 2, 1))
    scales = out["model.layers.1.mlp.experts.gate_up_proj_scales"][:, 1::2]  # up rows
    up = weights["layers.1.moe.experts_up"]
    assert np.array_equal(up.scales, np.exp2(scales.astype(np.float32) - 127).transpose(0, 2, 1))
    _values_equal(weights, load_checkpoint(twin))
    rounded = load_checkpoint(bf16, model)       # quantize-on-load: the same codes
    for k in packed:
        assert np.array_equal(weights[k].codes, rounded[k].codes), k
        assert np.array_equal(weights[k].scales, rounded[k].scales), k


@pytest.mark.slow
def test_gpt_oss_mxfp4_through_the_reference(gpt_oss):
    """(~30 s) Decoded through the reference's own dequantization, and the
    reference's logits equal quantize-on-load's of the same bf16 weights
    (measured difference 0.0)."""
    folder, twin, bf16, _ = gpt_oss
    model = build(from_hf(folder))
    weights = load_checkpoint(folder, model)
    _decoded_equal(weights, load_checkpoint(twin))
    _same_as_quantize_on_load(model, weights, bf16)


@pytest.mark.parametrize("key, module, skipped", [
    # transformers' should_convert_module's own examples, and a boundary after a dot.
    ("layer.1", "layer.1.attn", True), ("layer.1", "layer.11.attn", False),
    ("layer.*", "layer.11.attn", True), ("mlp.gate", "mlp.gate_proj", False),
    ("fc1", "model.decoder.layers.23.fc1", True), ("model\\.layers\\.", "model.layers.0.mlp", True),
    ("(.*)*x", "model.layers.0.mlp.experts" * 4, False),   # linear time on RE2
])
def test_modules_to_not_convert_boundaries(key, module, skipped):
    assert shipped.read({"quant_method": "mxfp4", "modules_to_not_convert": [key]}
                        ).ignore[0].names(module) is skipped


def test_gpt_oss_modules_to_not_convert_follow_transformers():
    """Entries are regexes up to a module boundary, or suffixes."""
    scheme = shipped.read({**W.GPT_OSS_MXFP4, "modules_to_not_convert": [
        "model.layers.1", "layers.2.mlp.experts"]})
    at = lambda i: scheme.locate(f"model.layers.{i}.mlp.experts.down_proj", "experts")  # noqa: E731
    assert at(0)[2].fmt == "mxfp4" and at(10) is not None
    assert at(1) is None and at(2) is None
    assert scheme.locate("model.layers.0.mlp.experts.down_proj_bias", "experts") is None
    with pytest.raises(ConfigError, match="modules_to_not_convert\\[0\\]: 're:a\\(' is not a "
                                          "regular expression"):
        shipped.read({"quant_method": "mxfp4", "modules_to_not_convert": ["a("]})
    with pytest.raises(ConfigError, match="quant_method: 'mxfp8' is not supported; supported: "
                                          "\\['compressed-tensors', 'fp8', 'modelopt', 'mxfp4'\\]"):
        shipped.read({"quant_method": "mxfp8"})


def test_mxfp4_experts_the_kernel_cannot_tile_load_dequantized(tmp_path):
    """intermediate 96 (gpt-oss's transformers fixture size): down_proj's 96
    inputs are not whole 64-row e2m1 code tiles, so experts stay plain."""
    config = {**W.GPT_OSS, "intermediate_size": 96}
    folder, twin, _, _ = _gpt_oss(tmp_path, config)
    card = from_hf(folder)
    assert card.quantize.chosen() == {}
    _, notes = shipped_view.card_table(shipped.read(W.GPT_OSS_MXFP4), build(card), config)
    assert len(notes) == 1 and notes[0].startswith("experts weights ship as mxfp4 but stay "
                                                   "bfloat16: layers.0.moe.experts_down")
    weights = load_checkpoint(folder)
    assert not any(isinstance(v, quantize.Packed) for v in weights.values())
    _values_equal(weights, load_checkpoint(twin))


def test_fp8_partial_last_block_loads_dequantized(tmp_path):
    """DeepSeek fp8 with intermediate 200: down_proj's inputs end in a block
    of 72 (scale_inv [1, 2]); gate / up end in a 72-row output block, which
    fp8_b128 holds, but the kind's format is one, so dense stays plain."""
    config = {**W.QWEN3, "intermediate_size": 200}
    tensors = W.qwen3_tensors(np.random.default_rng(8), config)
    out, twin = W.ship(tensors, {k: "fp8" for k in tensors if k.endswith("proj.weight")})
    assert out["model.layers.0.mlp.down_proj.weight_scale_inv"].shape == (1, 2)
    folder = W.write(tmp_path / "fp8", {**config, "quantization_config": W.FP8}, out)
    card = from_hf(folder)
    assert card.quantize.chosen() == {}
    model = build(card)
    _, notes = shipped_view.card_table(shipped.read(W.FP8), model, config)
    assert notes == ["dense weights ship as fp8_b128 but stay bfloat16: layers.0.mlp.down: "
                     "format 'fp8_b128' needs the input dimension to be a multiple of 128 "
                     "(whole 32-row code tiles and whole scale groups of 128); found 200; the "
                     "shipped values are dequantized on load"]
    weights = load_checkpoint(folder, model)
    assert not any(isinstance(v, quantize.Packed) for v in weights.values())
    _values_equal(weights, load_checkpoint(W.write(tmp_path / "twin", config, twin), model))


def test_the_plan_report_says_once_what_loads_dequantized(tmp_path, capsys):
    config = {**W.QWEN3, "intermediate_size": 200, "num_hidden_layers": 1}
    tensors = W.qwen3_tensors(np.random.default_rng(9), config)
    out, _ = W.ship(tensors, {k: "fp8" for k in tensors if k.endswith("proj.weight")})
    folder = W.write(tmp_path / "fp8", {**config, "quantization_config": W.FP8}, out)
    code, text, _ = run("plan", str(folder), capsys=capsys)
    assert code == 0
    flat = " ".join(text.split())
    assert flat.count("shipped formats: dense weights ship as fp8_b128 but stay bfloat16: "
                      "layers.0.mlp.down") == 1
    assert flat.count("ship as fp8_b128") == 1 and "Weight formats" not in flat
