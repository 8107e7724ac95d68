"""NVIDIA ModelOpt's NVFP4 checkpoints (models/shipped_modelopt.py): written by
tests/models/shipped_writers.py's numpy writer, loaded as shipped, decoded bit
for bit as the writer decodes them; configs that do not load are named."""

import numpy as np
import pytest

from megakernel.errors import ConfigError
from megakernel.ir.config import build
from megakernel.models import shipped
from megakernel.models.checkpoint import load_checkpoint
from megakernel.models.hf import from_hf
from tests.models import shipped_writers as W
from tests.models.test_shipped_checkpoints import _decoded_equal

# NVIDIA ModelOpt's NVFP4 export: every Linear but the router and the head, an
# FP8 cache whose k/v scales (and the activations' input scales) are not read
MODELOPT = {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16,
            "kv_cache_quant_algo": "FP8", "producer": {"name": "modelopt", "version": "0.37"},
            "exclude_modules": ["lm_head", "model.layers.*.mlp.gate"]}


def test_modelopt_nvfp4_loads_as_shipped(tmp_path):
    tensors = W.qwen3_tensors(np.random.default_rng(2), W.QWEN3_MOE)
    chosen = {k: "modelopt_nvfp4" for k in tensors
              if k.endswith("proj.weight") and k.startswith("model.layers.")}
    assert len(chosen) == 2 * (4 + 3 * 4)       # no router, no lm_head
    out, twin = W.ship(tensors, chosen)
    out["model.layers.0.self_attn.k_proj.k_scale"] = np.asarray(1.0, np.float32)
    folder = W.write(tmp_path / "q", {**W.QWEN3_MOE, "quantization_config": MODELOPT}, out)
    card = from_hf(folder)
    assert card.quantize.chosen() == {"dense": "nvfp4", "experts": "nvfp4"}
    weights = load_checkpoint(folder, build(card))
    _decoded_equal(weights, load_checkpoint(W.write(tmp_path / "twin", W.QWEN3_MOE, twin)))


@pytest.mark.parametrize("change, named", [
    (dict(quant_algo="FP8"), "quant_algo: found 'FP8'"),
    (dict(group_size=32), "group_size: found 32"),
    (dict(exclude_modules=["lm_head", "model.layers.[01].mlp.gate"]),
     "exclude_modules[1]: 'model.layers.[01].mlp.gate': fnmatch character classes"),
    (dict(ignore=["lm_head"]), "exclude_modules and ignore differ"),
    (dict(config_groups={"group_0": {"targets": ["Linear"], "weights": {
        "num_bits": 8, "type": "float", "group_size": None}}}),
     "config_groups.group_0.weights: found"),
    (dict(awq_block=4), "awq_block: 4 (unknown key"),
])
def test_modelopt_configs_that_do_not_load_are_named(change, named):
    with pytest.raises(ConfigError) as info:
        shipped.read({**MODELOPT, **change})
    assert named in str(info.value), str(info.value)


def test_modelopt_exclusions_are_whole_fnmatch_names():
    scheme = shipped.read({**MODELOPT, "exclude_modules": ["lm_head", "*.mlp.gate"]})
    assert scheme.layout_of("model.layers.3.mlp.gate", "router") is None
    assert scheme.layout_of("model.layers.3.mlp.gate_proj", "dense").fmt == "nvfp4"
    assert scheme.layout_of("lm_head", "lm_head") is None
