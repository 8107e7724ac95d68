"""The Hugging Face fixtures quantized as their producers ship them
(tests/fixtures/hf/README.md, 'Quantized as shipped'): gpt-oss with OpenAI's
MXFP4 experts, a DeepSeek-V3 in block fp8 whose routed experts' inputs end
in half a block, and a qwen3 in compressed-tensors NVFP4 (read by
transformers through compressed-tensors' own decompression). Their logits come from transformers reading those files, so
loading them as shipped and matching those logits checks the loader's layouts
against transformers' own reading of them, not against this project's
writer (tests/models/shipped_writers.py)."""

import json

import numpy as np
import pytest

from megakernel import quantize
from megakernel.ir.config import build
from megakernel.models import shipped, shipped_view
from megakernel.models.checkpoint import load_checkpoint
from megakernel.models.hf import from_hf
from tests.models.hub_cache import hub_snapshot
from tests.models.test_hf_fixtures import FIXTURES, _matches_hf_logits

# The hub snapshot test reuses deepseek_v3_fp8's compiled reference.
FP8 = pytest.mark.xdist_group("hf_deepseek_fp8_reference")


def _packed(folder):
    card = from_hf(folder, dtype="float32")
    model = build(card)
    weights = load_checkpoint(folder, model)
    return card, model, weights, {k for k, v in weights.items()
                                  if isinstance(v, quantize.Packed)}


def test_gpt_oss_mxfp4_experts_load_as_their_shipped_codes():
    folder = FIXTURES / "gpt_oss_mxfp4"
    card, model, weights, packed = _packed(folder)
    assert card.quantize.chosen() == {"experts": "mxfp4"}
    assert packed == {f"layers.{i}.moe.experts_{p}" for i in (0, 1)
                      for p in ("gate", "up", "down")}
    # every code of the shipped blocks is used: 4 experts x 128 x 64 gate codes
    gate = weights["layers.1.moe.experts_gate"]
    assert gate.codes.shape == (4, 64, 128) and len(np.unique(gate.codes)) == 16
    assert all(str(w.dtype) == "float32" for k, w in weights.items() if k not in packed)


def test_qwen3_nvfp4_linears_load_as_their_shipped_codes():
    folder = FIXTURES / "qwen3_nvfp4"
    card, model, weights, packed = _packed(folder)
    assert card.quantize.chosen() == {"dense": "nvfp4"}
    assert packed == {k for k, s in model.params().items() if s.format == "nvfp4"}
    assert len(packed) == 2 * 7          # q, k, v, o, gate, up, down per layer
    q = weights["layers.0.q_proj.weight"]
    assert q.codes.shape == (128, 128) and len(np.unique(q.codes)) == 16
    assert q.scales.shape == (128 // 16, 128)   # block scale / the module's global


def test_deepseek_fp8_half_blocks_load_dequantized_the_rest_as_codes():
    """Every quantized input width is 128 but the routed experts' down
    projections' 64: experts stay plain (with one note), dense loads as
    fp8_b128 codes; MLA's up-projections are read plain as always."""
    folder = FIXTURES / "deepseek_v3_fp8"
    card, model, weights, packed = _packed(folder)
    assert card.quantize.chosen() == {"dense": "fp8_b128"}
    config = json.loads((folder / "config.json").read_text())
    _, notes = shipped_view.card_table(shipped.read(config["quantization_config"]), model,
                                       config)
    assert len(notes) == 1 and notes[0].startswith(
        "experts weights ship as fp8_b128 but stay float32: layers.1.moe.experts_down")
    assert packed == {k for k, s in model.params().items() if s.format == "fp8_b128"}
    assert {k.split(".", 2)[2] for k in packed} == {
        "q_a_proj.weight", "q_b_proj.weight", "kv_a_proj.weight", "o_proj.weight",
        "mlp.gate", "mlp.up", "mlp.down", "moe.shared_gate",
        "moe.shared_up", "moe.shared_down"}


# Measured (f32 reference vs transformers' f32 eager on its dequantized read):
# at most 3.8e-6 absolute (gpt_oss_mxfp4 decode 1), 3.3e-6 (deepseek_v3_fp8)
# and 2.7e-6 (qwen3_nvfp4 prefill),
# logits of O(1-4); the bound is _matches_hf_logits' 1e-4. gpt-oss's reference
# decode with packed experts compiles for ~15-20 s: slow.
@pytest.mark.parametrize("family", [pytest.param("gpt_oss_mxfp4", marks=pytest.mark.slow),
                                    pytest.param("deepseek_v3_fp8", marks=FP8), "qwen3_nvfp4"])
def test_reference_matches_hf_logits(family):
    _matches_hf_logits(FIXTURES / family)


@FP8
def test_hub_cache_snapshot_of_a_shipped_fp8_checkpoint(tmp_path):
    _matches_hf_logits(hub_snapshot(FIXTURES / "deepseek_v3_fp8", tmp_path))
