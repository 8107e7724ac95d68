"""DeepSeek-V3 / Kimi-K2 import: configs, checkpoints and the reference against
the logits transformers wrote for the two committed fixtures."""

import dataclasses
import json
import shutil
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

from megakernel.errors import ConfigError
from megakernel.ir.config import build
from megakernel.ir.ops import Rope
from megakernel.models import reference as R
from megakernel.models import zoo
from megakernel.models.checkpoint import load_checkpoint
from megakernel.models.hf import from_hf
from megakernel.models.hf_deepseek import rope_permutation
from tests.models.published_configs import DEEPSEEK_V3, KIMI_K2

FIXTURES = Path(__file__).parents[1] / "fixtures" / "hf"
FAMILIES = ["deepseek_v3", "deepseek_v3_nolora"]


def _bf16(config: dict) -> dict:
    return {k: v for k, v in config.items() if k != "quantization_config"}


def _run(folder, model, weights):
    """Errors of prefill + two decode steps, each max |err| / max |HF logits|."""
    exp = np.load(folder / "expected.npz")
    ids = jnp.asarray(exp["prefill_ids"])
    batch, prompt = ids.shape
    caches = R.init_caches(model, batch)
    logits, caches = R.decode_step(model, weights, ids, jnp.zeros(batch, jnp.int32), caches)
    out = [np.abs(np.asarray(logits) - exp["logits_prefill"]).max()
           / np.abs(exp["logits_prefill"]).max()]
    for step in (1, 2):
        start = jnp.full(batch, prompt + step - 1, jnp.int32)
        logits, caches = R.decode_step(model, weights, jnp.asarray(exp[f"decode_ids_{step}"]),
                                       start, caches)
        want = exp[f"logits_decode_{step}"]
        out.append(np.abs(np.asarray(logits) - want).max() / np.abs(want).max())
    return out, caches


@pytest.mark.parametrize("family", FAMILIES)
def test_reference_matches_hf_logits(family):
    """Measured: at most 7.8e-7 of the logit scale (f32 compute on the stored
    bf16 weights, as the fixtures were made); the bound is 1e-4."""
    folder = FIXTURES / family
    model = build(from_hf(folder, dtype="float32"))
    errors, caches = _run(folder, model, R.as_jax(load_checkpoint(folder, model)))
    assert max(errors) <= 1e-4, errors
    # one latent cache per MLA layer: c_kv (32) + k_pe (8) per token
    assert {k: v.shape for k, v in caches.items()} == {
        f"layers.{i}.mla.latent": (2, model.max_seq_len, 40) for i in range(2)}


def test_fixture_cards():
    lora = from_hf(FIXTURES / "deepseek_v3")
    assert (lora.mla.q_lora_rank, lora.mla.kv_lora_rank, lora.mla.qk_nope_head_dim,
            lora.mla.qk_rope_head_dim, lora.mla.v_head_dim) == (32, 32, 16, 8, 16)
    assert lora.rope_scaling.rope_type == "yarn" and lora.rope_scaling.mscale_all_dim == 0.8
    assert (lora.moe.n_group, lora.moe.topk_group, lora.moe.routed_scaling) == (2, 1, 2.5)
    assert lora.first_k_dense == 1 and lora.moe.correction_bias and lora.moe.scoring == "sigmoid"
    mla = build(lora).layers[0].node("mla").op
    assert mla.softmax_scale == pytest.approx(0.342380, abs=1e-6)     # the README's value
    plain = from_hf(FIXTURES / "deepseek_v3_nolora")
    assert plain.mla.q_lora_rank == 0 and plain.rope_scaling is None
    assert [n.name for n in build(plain).layers[0].nodes][:3] == ["input_norm", "q_proj",
                                                                  "kv_a_proj"]


def test_fixture_loads_in_storage_dtype():
    model = build(from_hf(FIXTURES / "deepseek_v3"))
    weights = load_checkpoint(FIXTURES / "deepseek_v3")
    assert list(weights) == list(model.params())
    assert weights["layers.1.moe.router_bias"].dtype == np.float32      # kept in f32
    assert all(str(w.dtype) == "bfloat16" for k, w in weights.items() if "router_bias" not in k)


def test_without_the_rope_permutation_parity_breaks(tmp_path):
    """rope_interleave false loads the rope rows unpermuted: the logits move
    far past the tolerance (the README measured 3.26), so the permutation is
    what makes the interleaved rotation right."""
    folder = tmp_path / "deepseek_v3"
    shutil.copytree(FIXTURES / "deepseek_v3", folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "rope_interleave": False}))
    model = build(from_hf(folder, dtype="float32"))
    errors, _ = _run(folder, model, R.as_jax(load_checkpoint(folder, model)))
    assert max(errors) > 1e-2, errors


def test_permuted_rotate_half_equals_the_interleaved_rotation():
    """Scores of interleaved-pair RoPE (pairs 2i, 2i+1, DeepSeek's own code) equal
    rotate-half on features permuted evens-then-odds, as the loader permutes."""
    rng = np.random.default_rng(0)
    dr, n = 8, 6
    q, k = rng.standard_normal((2, n, dr))
    pos = jnp.arange(n)
    op = Rope(1, dr, 1e4)
    inv = op.inv_freq()
    ang = np.arange(n)[:, None] * inv[None, :]

    def interleaved(x):
        out = np.empty_like(x)
        out[:, 0::2] = x[:, 0::2] * np.cos(ang) - x[:, 1::2] * np.sin(ang)
        out[:, 1::2] = x[:, 1::2] * np.cos(ang) + x[:, 0::2] * np.sin(ang)
        return out

    perm = rope_permutation(dr)
    half = lambda x: np.asarray(R.rope(op, jnp.asarray(x[:, perm], jnp.float32), pos))  # noqa: E731
    want = interleaved(q) @ interleaved(k).T
    np.testing.assert_allclose(half(q) @ half(k).T, want, rtol=1e-5, atol=1e-5)


def test_published_configs_are_the_zoo_cards():
    assert from_hf(_bf16(DEEPSEEK_V3), name="deepseek-v3") == zoo.card("deepseek-v3")
    assert from_hf(_bf16(KIMI_K2), name="kimi-k2") == zoo.card("kimi-k2")


@pytest.mark.parametrize("config", [DEEPSEEK_V3, KIMI_K2], ids=["deepseek_v3", "kimi_k2"])
def test_fp8_checkpoints_import_with_fp8_dense_and_experts(config):
    """The published fp8 configs: every linear of the layers ships fp8_b128;
    MLA's up-projections are read plain (dequantized on load)."""
    card = from_hf(config)
    assert card.quantize.chosen() == {"dense": "fp8_b128", "experts": "fp8_b128"}
    assert card == dataclasses.replace(from_hf(_bf16(config)), quantize=card.quantize)


def test_unsupported_routing_and_heads_are_named():
    bad = _bf16({**DEEPSEEK_V3, "scoring_func": "softmax", "topk_method": "greedy",
                 "moe_layer_freq": 2, "num_key_value_heads": 8,
                 "rope_scaling": {"type": "dynamic", "factor": 2.0}})
    with pytest.raises(ConfigError) as info:
        from_hf(bad)
    text = str(info.value)
    for key in ("scoring_func", "topk_method", "moe_layer_freq", "num_key_value_heads",
                "rope_scaling.rope_type", "5 problems"):
        assert key in text, key


def test_mtp_layers_are_left_out(tmp_path):
    """A checkpoint with num_nextn_predict_layers keeps its MTP layer under
    model.layers.{L}.*: it loads without it, the model unchanged."""
    from safetensors.numpy import load_file, save_file

    folder = tmp_path / "ds"
    shutil.copytree(FIXTURES / "deepseek_v3", folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "num_nextn_predict_layers": 1}))
    tensors = load_file(folder / "model.safetensors")
    extra = {k.replace("model.layers.1.", "model.layers.2."): v for k, v in tensors.items()
             if k.startswith("model.layers.1.")}
    extra["model.layers.2.eh_proj.weight"] = np.zeros((64, 128), np.float32)
    save_file({**tensors, **extra}, folder / "model.safetensors")
    weights = load_checkpoint(folder)
    assert not any(k.startswith("layers.2.") for k in weights)
    base = load_checkpoint(FIXTURES / "deepseek_v3")
    assert all(np.array_equal(weights[k], base[k]) for k in base)
