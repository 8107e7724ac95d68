"""Checkpoints and HF configs are data: corrupt headers, escaping shard paths,
integer or non-finite weights and zeros that used to become defaults are named
errors (copies of tests/fixtures/hf, corrupted)."""

import json
import os
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from megakernel.errors import ConfigError
from megakernel.models.checkpoint import load_checkpoint
from megakernel.models.hf import from_hf

FIXTURES = Path(__file__).parents[1] / "fixtures" / "hf"
EMBED = "model.embed_tokens.weight"


def copy(tmp_path, family="llama"):
    return Path(shutil.copytree(FIXTURES / family, tmp_path / family))


def header(path):
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    return json.loads(raw[8:8 + n]), raw[8 + n:]


def rewrite(path, head, data):
    text = json.dumps(head).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)


def test_truncated_file_names_the_tensor(tmp_path):
    folder = copy(tmp_path)
    st = folder / "model.safetensors"
    st.write_bytes(st.read_bytes()[:-1000])
    with pytest.raises(ConfigError, match=r"model\.safetensors: '.*': data_offsets .* truncated"):
        load_checkpoint(folder)


@pytest.mark.parametrize("n", [2**62, 2**40, 10])
def test_header_length_beyond_the_file(tmp_path, n):
    folder = copy(tmp_path)
    st = folder / "model.safetensors"
    raw = st.read_bytes()
    st.write_bytes(struct.pack("<Q", n) + raw[8:] if n != 10 else raw[:6])
    with pytest.raises(ConfigError, match="model.safetensors"):
        load_checkpoint(folder)


def test_offsets_of_two_tib_and_unknown_dtypes(tmp_path):
    folder = copy(tmp_path)
    st = folder / "model.safetensors"
    head, data = header(st)
    head[EMBED]["data_offsets"] = [0, 2 * 2**40]
    rewrite(st, head, data)
    with pytest.raises(ConfigError, match=EMBED.replace(".", r"\.") + ".*data_offsets"):
        load_checkpoint(folder)
    head[EMBED] = {**head[EMBED], "dtype": "Q7", "data_offsets": [0, 2]}
    rewrite(st, head, data)
    with pytest.raises(ConfigError, match="dtype 'Q7' is not a safetensors dtype"):
        load_checkpoint(folder)


def _index(folder, weight_map):
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))


def test_index_without_weight_map(tmp_path):
    folder = copy(tmp_path)
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}}))
    with pytest.raises(ConfigError, match="has no weight_map"):
        load_checkpoint(folder)


@pytest.mark.parametrize("target", ["/etc/passwd", "../outside.safetensors", "link.safetensors"])
def test_shard_paths_stay_inside_the_folder(tmp_path, target):
    folder = copy(tmp_path)
    head, _ = header(folder / "model.safetensors")
    outside = tmp_path / "outside.safetensors"
    shutil.copy(folder / "model.safetensors", outside)
    os.symlink(outside, folder / "link.safetensors")
    _index(folder, {name: target for name in head if name != "__metadata__"})
    with pytest.raises(ConfigError, match="outside the checkpoint folder|must be relative"):
        load_checkpoint(folder)


def _retyped(tmp_path, array):
    folder = copy(tmp_path)
    st = folder / "model.safetensors"
    tensors = load_file(st)
    tensors[EMBED] = array(tensors[EMBED])
    save_file(tensors, st)
    return folder


def test_integer_weights_are_refused_by_name(tmp_path):
    folder = _retyped(tmp_path, lambda a: np.ones(a.shape, np.int8))
    with pytest.raises(ConfigError, match=r"embed\.weight: model\.embed_tokens\.weight is stored "
                                          r"as I8; the model expects a float"):
        load_checkpoint(folder)


def test_float16_weights_are_converted(tmp_path):
    folder = _retyped(tmp_path, lambda a: a.astype(np.float32).astype(np.float16))
    reference = load_checkpoint(FIXTURES / "llama")
    weights = load_checkpoint(folder)
    assert weights["embed.weight"].dtype == reference["embed.weight"].dtype
    np.testing.assert_allclose(weights["embed.weight"].astype(np.float32),
                               reference["embed.weight"].astype(np.float32), rtol=1e-2, atol=1e-3)


def test_nan_weights_are_refused_by_name(tmp_path):
    def poison(a):
        a = a.astype(np.float32)
        a[3, 5] = np.nan
        return a
    folder = _retyped(tmp_path, poison)
    with pytest.raises(ConfigError, match=r"embed\.weight: .* holds 1 NaN or infinite values "
                                          r"\(first at index \[3, 5\]\)"):
        load_checkpoint(folder)


def test_config_not_utf8_or_with_duplicate_keys(tmp_path):
    folder = copy(tmp_path)
    (folder / "config.json").write_bytes(b'{"model_type": "llama\xff"}')
    with pytest.raises(ConfigError, match="not UTF-8"):
        from_hf(folder)
    text = (FIXTURES / "llama" / "config.json").read_text()
    (folder / "config.json").write_text(text.replace('"vocab_size": 128',
                                                     '"vocab_size": 128, "vocab_size": 256'))
    with pytest.raises(ConfigError, match=r"keys \['vocab_size'\] appear more than once"):
        from_hf(folder)


def _config(family, **changes):
    data = json.loads((FIXTURES / family / "config.json").read_text())
    data.update(changes)
    return data


@pytest.mark.parametrize("family, change, key", [
    ("qwen3", dict(rope_theta=0), "rope_theta: expected a value > 1.0, found 0"),
    ("qwen3", dict(rope_parameters={"rope_type": "default", "rope_theta": 0}),
     "rope_parameters.rope_theta: expected a value > 1.0"),
    ("qwen3_moe", dict(num_experts_per_tok=0), "num_experts_per_tok: expected a value >= 1"),
    ("qwen3_moe", dict(moe_intermediate_size=0), "moe_intermediate_size: expected a value >= 1"),
    ("mixtral", dict(num_experts_per_tok=0), "num_experts_per_tok: expected a value >= 1"),
    ("llama", dict(max_position_embeddings=0), "max_position_embeddings: expected a value >= 1"),
    ("qwen3", dict(rms_norm_eps=float("nan")), "rms_norm_eps: expected a finite number"),
    ("qwen3", dict(hidden_size=10**12), "hidden_size: expected a value <= 1048576"),
    ("qwen3", dict(layer_types=[{}, []]), "layer_types"),
])
def test_hf_zeros_and_bad_numbers_name_the_key(family, change, key):
    with pytest.raises(ConfigError) as info:
        from_hf(_config(family, **change))
    assert key in str(info.value)
