"""Qwen3.5 / Qwen3-Next from Hugging Face: config import, checkpoint names, and
the reference against the logits and Gated DeltaNet states transformers wrote
(tests/fixtures/hf/qwen3_5, qwen3_next)."""

import copy
import json
import shutil
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from megakernel.errors import ConfigError
from megakernel.ir.config import build
from megakernel.models import reference as R
from megakernel.models.checkpoint import load_checkpoint
from megakernel.models.hf import from_hf

FIXTURES = Path(__file__).parents[1] / "fixtures" / "hf"
HYBRID = ["qwen3_5", "qwen3_next"]
# Measured (float32 reference vs transformers' float32 eager run): logits differ
# by at most 1.1e-5 (qwen3_next prefill; logit scale 3.5-4.3), conv and
# recurrent states by at most 8.3e-6.
LOGIT_TOL = 1e-4
STATE_TOL = 5e-5


def gdn_states(caches, step, exp, batch):
    """(ours, HF's) conv and recurrent states of each GDN layer after ``step``:
    HF keeps Kc raw columns [B, C, Kc] of which the last Kc-1 are read again."""
    for i in range(3):
        conv = np.concatenate([np.asarray(caches[f"layers.{i}.gdn.hist_{p}"], np.float32)
                               for p in "qkv"], axis=-1)
        yield f"conv {i}", conv.transpose(0, 2, 1), exp[f"conv_state_{i}_{step}"][:, :, 1:]
        yield (f"recurrent {i}", np.asarray(caches[f"layers.{i}.gdn.recurrent"]),
               exp[f"recurrent_state_{i}_{step}"])


@pytest.mark.parametrize("family", HYBRID)
def test_reference_matches_hf_logits_and_states(family):
    folder = FIXTURES / family
    model = build(from_hf(folder, dtype="float32"))
    weights = R.as_jax(load_checkpoint(folder, model))
    exp = np.load(folder / "expected.npz")
    ids = jnp.asarray(exp["prefill_ids"])
    batch, prompt = ids.shape
    steps = [("prefill", ids, 0, exp["logits_prefill"])] + [
        (f"decode_{s}", jnp.asarray(exp[f"decode_ids_{s}"]), prompt + s - 1,
         exp[f"logits_decode_{s}"]) for s in (1, 2)]
    caches = R.init_caches(model, batch)
    for step, tokens, start, want in steps:
        logits, caches = R.decode_step(model, weights, tokens,
                                       jnp.full(batch, start, jnp.int32), caches)
        scale = float(np.max(np.abs(want)))
        assert float(np.max(np.abs(logits - want))) <= LOGIT_TOL * scale, step
        for what, ours, theirs in gdn_states(caches, step, exp, batch):
            np.testing.assert_allclose(ours, theirs, atol=STATE_TOL, rtol=0,
                                       err_msg=f"{step} {what}")


def test_fixture_configs_import_as_hybrid_cards():
    a, b = (from_hf(FIXTURES / f) for f in HYBRID)
    for card in (a, b):
        assert card.layer_types == ("linear_attention",) * 3 + ("full_attention",)
        assert card.attn_output_gate and card.norm_offset and card.qk_norm
        assert card.rotary_dim == 8 and card.rope_theta == 1e7 and card.head_dim == 32
        la = card.linear_attention
        assert (la.num_key_heads, la.num_value_heads, la.key_head_dim, la.value_head_dim,
                la.conv_kernel) == (2, 4, 16, 16, 4)
    assert a.moe is None
    m = b.moe
    assert (m.num_experts, m.top_k, m.expert_intermediate, m.renormalize) == (4, 2, 32, True)
    assert (m.num_shared_experts, m.shared_intermediate, m.shared_expert_gate) == (1, 64, True)


def _config(family="qwen3_5"):
    return json.loads((FIXTURES / family / "config.json").read_text())


def test_layer_types_default_from_the_interval_and_rope_factor_from_either_place():
    cfg = _config()
    del cfg["layer_types"]
    cfg.update(num_hidden_layers=8, full_attention_interval=4)
    cfg["rope_parameters"].pop("partial_rotary_factor")
    cfg["partial_rotary_factor"] = 0.5                       # the 4.x place
    card = from_hf(cfg)
    assert card.layer_types == (("linear_attention",) * 3 + ("full_attention",)) * 2
    assert card.rotary_dim == 16
    assert [(s.start, s.count, s.period) for s in build(card).stacks] == [(0, 2, 4)]


def test_keys_that_would_mean_another_model_are_listed():
    cfg = _config()
    cfg.update(attn_output_gate=False, output_gate_type="sigmoid", mamba_ssm_dtype="bfloat16",
               layer_types=["linear_attention", "sliding_attention", "full_attention",
                            "full_attention"], mlp_only_layers=[1])
    with pytest.raises(ConfigError) as info:
        from_hf(cfg)
    text = str(info.value)
    for key in ("attn_output_gate", "output_gate_type", "mamba_ssm_dtype", "layer_types",
                "mlp_only_layers"):
        assert key in text, key


def test_a_vision_language_config_imports_its_text_config():
    text = _config()
    vlm = {"model_type": "qwen3_5", "architectures": ["Qwen3_5ForConditionalGeneration"],
           "text_config": {**copy.deepcopy(text), "model_type": "qwen3_5_text"},
           "vision_config": {"depth": 2, "hidden_size": 32}, "image_token_id": 7,
           "video_token_id": 8, "vision_start_token_id": 9, "vision_end_token_id": 10,
           "tie_word_embeddings": False, "transformers_version": "5.24.0"}
    assert from_hf(vlm, name="q") == from_hf(text, name="q")
    vlm["tie_word_embeddings"] = True
    with pytest.raises(ConfigError, match="tie_word_embeddings=True differs"):
        from_hf(vlm)


def test_a_published_layout_checkpoint_loads_like_the_text_one(tmp_path):
    """model.language_model.* names, a vision tower and an MTP head (not read)."""
    src = FIXTURES / "qwen3_5"
    tensors = load_file(str(src / "model.safetensors"))
    renamed = {k.replace("model.", "model.language_model.", 1) if k.startswith("model.") else k: v
               for k, v in tensors.items()}
    renamed["model.visual.blocks.0.attn.qkv.weight"] = np.zeros((4, 4), np.float32)
    renamed["mtp.fc.weight"] = np.zeros((4, 4), np.float32)
    save_file(renamed, str(tmp_path / "model.safetensors"))
    cfg = {"model_type": "qwen3_5", "text_config": {**_config(), "model_type": "qwen3_5_text"},
           "vision_config": {"depth": 1}}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    got, want = load_checkpoint(tmp_path), load_checkpoint(src)
    assert list(got) == list(want)
    assert all(np.array_equal(got[k], want[k]) for k in want)
    assert got["layers.0.gdn.A_log"].dtype == np.float32


def test_fused_qwen3_next_rows_are_regrouped_per_key_head(tmp_path):
    """The IR's q/k/v/z/b/a projections and conv taps are cut from the fused
    rows exactly as transformers' fix_query_key_value_ordering orders them."""
    folder = FIXTURES / "qwen3_next"
    w = load_checkpoint(folder, build(from_hf(folder, dtype="float32")))
    hf = {k: np.asarray(v, np.float32) for k, v in load_file(str(folder /
                                                                 "model.safetensors")).items()}
    p = "model.layers.1.linear_attn."
    qkvz = hf[p + "in_proj_qkvz.weight"].reshape(2, 2 * 16 + 2 * 2 * 16, 64)
    v_head3 = qkvz[1, 32 + 16:32 + 32]                 # key head 1, its second value head
    np.testing.assert_array_equal(w["layers.1.v_proj.weight"][:, 48:64], v_head3.T)
    ba = hf[p + "in_proj_ba.weight"].reshape(2, 4, 64)
    np.testing.assert_array_equal(w["layers.1.a_proj.weight"][:, 2], ba[1, 2])
    conv = hf[p + "conv1d.weight"][:, 0, :]            # flat q | k | v channels
    np.testing.assert_array_equal(w["layers.1.gdn.conv_k"], conv[32:64].T)
    q_proj = hf["model.layers.3.self_attn.q_proj.weight"].reshape(4, 2, 32, 64)
    np.testing.assert_array_equal(w["layers.3.gate_proj.weight"][:, 32:64], q_proj[1, 1].T)
    assert w["layers.0.moe.shared_expert_gate"].shape == (64,)
    shutil.rmtree(tmp_path)
