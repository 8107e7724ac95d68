"""Loading HF safetensors checkpoints: names, transposes, stacking, errors."""

import json

import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import save_file

from megakernel.errors import ConfigError
from megakernel.ir.config import build
from megakernel.models.checkpoint import load_checkpoint
from megakernel.models.hf import from_hf

H, I, V, L, HEADS, KV, D, E, EI = 64, 128, 96, 2, 4, 2, 16, 4, 48
BASE = {"vocab_size": V, "hidden_size": H, "intermediate_size": I, "num_hidden_layers": L,
        "num_attention_heads": HEADS, "num_key_value_heads": KV, "head_dim": D,
        "torch_dtype": "float32"}
CONFIGS = {
    "llama": {"model_type": "llama", "tie_word_embeddings": True},
    "qwen2": {"model_type": "qwen2"},
    "qwen3": {"model_type": "qwen3"},
    "qwen3_moe": {"model_type": "qwen3_moe", "num_experts": E, "num_experts_per_tok": 2,
                  "moe_intermediate_size": EI, "norm_topk_prob": True},
    "mixtral": {"model_type": "mixtral", "num_local_experts": E, "num_experts_per_tok": 2},
}


def hf_tensors(family, rng, fused=None):
    """Random tensors named and shaped as HF saves them ([out, in] linears),
    written independently of the loader's table."""
    r = lambda *shape: rng.standard_normal(shape).astype(np.float32)  # noqa: E731
    t = {"model.embed_tokens.weight": r(V, H), "model.norm.weight": r(H)}
    if family != "llama":
        t["lm_head.weight"] = r(V, H)
    for i in range(L):
        p = f"model.layers.{i}."
        t |= {p + "input_layernorm.weight": r(H), p + "post_attention_layernorm.weight": r(H),
              p + "self_attn.q_proj.weight": r(HEADS * D, H),
              p + "self_attn.k_proj.weight": r(KV * D, H),
              p + "self_attn.v_proj.weight": r(KV * D, H),
              p + "self_attn.o_proj.weight": r(H, HEADS * D)}
        if family == "qwen2":
            t |= {p + "self_attn.q_proj.bias": r(HEADS * D), p + "self_attn.k_proj.bias": r(KV * D),
                  p + "self_attn.v_proj.bias": r(KV * D)}
        if family.startswith("qwen3"):
            t |= {p + "self_attn.q_norm.weight": r(D), p + "self_attn.k_norm.weight": r(D)}
        if family == "qwen3_moe":
            t[p + "mlp.gate.weight"] = r(E, H)
            if fused == "out_in":
                t[p + "mlp.experts.gate_up_proj"] = r(E, 2 * EI, H)
                t[p + "mlp.experts.down_proj"] = r(E, H, EI)
            elif fused == "in_out":
                t[p + "mlp.experts.gate_up_proj"] = r(E, H, 2 * EI)
                t[p + "mlp.experts.down_proj"] = r(E, EI, H)
            else:
                for e in range(E):
                    q = f"{p}mlp.experts.{e}."
                    t |= {q + "gate_proj.weight": r(EI, H), q + "up_proj.weight": r(EI, H),
                          q + "down_proj.weight": r(H, EI)}
        elif family == "mixtral":
            t[p + "block_sparse_moe.gate.weight"] = r(E, H)
            for e in range(E):
                q = f"{p}block_sparse_moe.experts.{e}."
                t |= {q + "w1.weight": r(I, H), q + "w3.weight": r(I, H), q + "w2.weight": r(H, I)}
        else:
            t |= {p + "mlp.gate_proj.weight": r(I, H), p + "mlp.up_proj.weight": r(I, H),
                  p + "mlp.down_proj.weight": r(H, I)}
    return t


def write(folder, family, tensors, shards=1, config=None):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config or {**BASE, **CONFIGS[family]}))
    names = sorted(tensors)
    if shards == 1:
        save_file(tensors, folder / "model.safetensors")
        return folder
    weight_map = {}
    for s in range(shards):
        part = names[s::shards]
        fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        save_file({n: tensors[n] for n in part}, folder / fname)
        weight_map |= {n: fname for n in part}
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return folder


def check_matches(family, hf, w, fused=None):
    """Each IR weight equals its HF tensor, transposed for linears."""
    assert np.array_equal(w["embed.weight"], hf["model.embed_tokens.weight"])
    assert np.array_equal(w["final_norm.weight"], hf["model.norm.weight"])
    if "lm_head.weight" in hf:
        assert np.array_equal(w["lm_head.weight"], hf["lm_head.weight"].T)
    for i in range(L):
        p, q = f"model.layers.{i}.", f"layers.{i}."
        for x in "qkvo":
            assert np.array_equal(w[f"{q}{x}_proj.weight"], hf[f"{p}self_attn.{x}_proj.weight"].T)
        assert np.array_equal(w[q + "post_norm.weight"], hf[p + "post_attention_layernorm.weight"])
        if family == "qwen2":
            assert np.array_equal(w[q + "k_proj.bias"], hf[p + "self_attn.k_proj.bias"])
        if family.startswith("qwen3"):
            assert np.array_equal(w[q + "k_norm.weight"], hf[p + "self_attn.k_norm.weight"])
        if family in ("llama", "qwen2", "qwen3"):
            assert np.array_equal(w[q + "mlp.down"], hf[p + "mlp.down_proj.weight"].T)
            assert np.array_equal(w[q + "mlp.gate"], hf[p + "mlp.gate_proj.weight"].T)
            continue
        router = "mlp.gate.weight" if family == "qwen3_moe" else "block_sparse_moe.gate.weight"
        assert np.array_equal(w[q + "moe.router"], hf[p + router].T)
        for e in range(E):
            gate, up, down = (w[q + f"moe.experts_{x}"][e] for x in ("gate", "up", "down"))
            if fused == "out_in":
                gu, dn = hf[p + "mlp.experts.gate_up_proj"][e], hf[p + "mlp.experts.down_proj"][e]
                want = gu[:EI].T, gu[EI:].T, dn.T
            elif fused == "in_out":
                gu, dn = hf[p + "mlp.experts.gate_up_proj"][e], hf[p + "mlp.experts.down_proj"][e]
                want = gu[:, :EI], gu[:, EI:], dn
            elif family == "qwen3_moe":
                x = f"{p}mlp.experts.{e}."
                want = (hf[x + "gate_proj.weight"].T, hf[x + "up_proj.weight"].T,
                        hf[x + "down_proj.weight"].T)
            else:
                x = f"{p}block_sparse_moe.experts.{e}."
                want = hf[x + "w1.weight"].T, hf[x + "w3.weight"].T, hf[x + "w2.weight"].T
            for got, exp in zip((gate, up, down), want):
                assert np.array_equal(got, exp)


@pytest.mark.parametrize("shards", [1, 3])
@pytest.mark.parametrize("family", sorted(CONFIGS))
def test_round_trip(tmp_path, family, shards):
    hf = hf_tensors(family, np.random.default_rng(0))
    w = load_checkpoint(write(tmp_path / family, family, hf, shards))
    model = build(from_hf(tmp_path / family))
    assert list(w) == list(model.params())
    for name, spec in model.params().items():
        assert w[name].shape == spec.shape and w[name].dtype == np.float32, name
    check_matches(family, hf, w)


@pytest.mark.parametrize("fused", ["out_in", "in_out"])
def test_fused_experts(tmp_path, fused):
    hf = hf_tensors("qwen3_moe", np.random.default_rng(1), fused)
    check_matches("qwen3_moe", hf, load_checkpoint(write(tmp_path, "qwen3_moe", hf)), fused)


def test_dtype_cast(tmp_path):
    folder = write(tmp_path, "qwen3", hf_tensors("qwen3", np.random.default_rng(2)))
    w = load_checkpoint(folder, dtype="bfloat16")
    assert all(a.dtype == ml_dtypes.bfloat16 for a in w.values())


def test_missing_tensor_is_named(tmp_path):
    hf = hf_tensors("qwen2", np.random.default_rng(3))
    del hf["model.layers.1.self_attn.v_proj.bias"]
    with pytest.raises(ConfigError, match=r"layers\.1\.v_proj\.bias.*self_attn\.v_proj\.bias"):
        load_checkpoint(write(tmp_path, "qwen2", hf))


def test_missing_expert_is_named(tmp_path):
    hf = hf_tensors("mixtral", np.random.default_rng(3))
    del hf["model.layers.0.block_sparse_moe.experts.2.w3.weight"]
    with pytest.raises(ConfigError, match=r"experts\.2\.w3\.weight is missing"):
        load_checkpoint(write(tmp_path, "mixtral", hf))


def test_wrong_shape_names_weight_and_shapes(tmp_path):
    hf = hf_tensors("llama", np.random.default_rng(4))
    hf["model.layers.0.self_attn.k_proj.weight"] = np.zeros((H, H), np.float32)
    with pytest.raises(ConfigError, match=r"layers\.0\.k_proj\.weight.*\[64, 64\], expected \[32, 64\]"):
        load_checkpoint(write(tmp_path, "llama", hf))


def test_leftover_tensors_are_listed(tmp_path):
    hf = hf_tensors("qwen3", np.random.default_rng(5))
    hf["model.layers.0.mlp.extra.weight"] = np.zeros(3, np.float32)
    hf["model.layers.0.self_attn.rotary_emb.inv_freq"] = np.zeros(8, np.float32)  # ignored
    with pytest.raises(ConfigError, match=r"1 tensors are not used.*mlp\.extra\.weight \[3\]"):
        load_checkpoint(write(tmp_path, "qwen3", hf))


def test_tied_head_may_be_stored_if_equal(tmp_path):
    hf = hf_tensors("llama", np.random.default_rng(6))
    hf["lm_head.weight"] = hf["model.embed_tokens.weight"].copy()
    assert "lm_head.weight" not in load_checkpoint(write(tmp_path / "a", "llama", hf))
    hf["lm_head.weight"] = hf["lm_head.weight"] + 1
    with pytest.raises(ConfigError, match="lm_head.weight"):
        load_checkpoint(write(tmp_path / "b", "llama", hf))


def test_folder_without_weights(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({**BASE, **CONFIGS["llama"]}))
    with pytest.raises(ConfigError, match="no model.safetensors"):
        load_checkpoint(tmp_path)


def test_a_cut_model_reads_only_its_first_layers_of_the_checkpoint():
    """``--layers K`` on a checkpoint: the first K layers' tensors are read,
    the later ones left unread only when the cut is said (first_layers)."""
    from pathlib import Path

    folder = Path(__file__).resolve().parents[1] / "fixtures" / "hf" / "llama"
    full = build(from_hf(folder))
    cut = full.truncated(1)
    whole = load_checkpoint(folder, full)
    part = load_checkpoint(folder, cut, first_layers=1)
    assert set(part) == set(cut.params()) and len(part) < len(whole)
    for name, array in part.items():
        np.testing.assert_array_equal(array, whole[name])
    with pytest.raises(ConfigError, match="model.layers.1.self_attn"):
        load_checkpoint(folder, cut)
