"""Checkpoint files as users have them and as an attacker may write them
(models/tensor_files.py): hub cache snapshots load; symlinks out of the folder
and its hub blobs, headers whose tensors overlap or leave gaps, and headers
over the size limit are named errors, the last before the header is read."""

import dataclasses
import json
import os
import shutil
import struct
import time
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from megakernel.errors import ConfigError
from megakernel.ir import limits
from megakernel.models.checkpoint import load_checkpoint
from megakernel.models.hf import from_hf
from megakernel.models.tensor_files import TensorFiles, read_header
from tests.models.hub_cache import hub_snapshot
from tests.models.test_checkpoint import hf_tensors, write

FIXTURES = Path(__file__).parents[1] / "fixtures" / "hf"


@pytest.mark.parametrize("shards", [1, 3])
def test_hub_snapshot_loads_like_the_plain_folder(tmp_path, shards):
    plain = write(tmp_path / "plain", "qwen3_moe",
                  hf_tensors("qwen3_moe", np.random.default_rng(0)), shards)
    snapshot = hub_snapshot(plain, tmp_path / "hub")
    assert all((snapshot / f.name).is_symlink() for f in plain.iterdir())
    card = from_hf(snapshot)
    assert card.name == "tiny"      # the hub repository's, not the revision's
    assert dataclasses.replace(card, name="plain") == from_hf(plain)
    got, want = load_checkpoint(snapshot), load_checkpoint(plain)
    assert list(got) == list(want)
    for name in want:
        assert np.array_equal(got[name], want[name]), name


def _llama_snapshot(tmp_path):
    return hub_snapshot(FIXTURES / "llama", tmp_path / "hub")


def test_a_snapshot_link_out_of_the_hub_blobs_is_refused(tmp_path):
    snapshot = _llama_snapshot(tmp_path)
    outside = tmp_path / "elsewhere.safetensors"
    shutil.copyfile(FIXTURES / "llama" / "model.safetensors", outside)
    (snapshot / "model.safetensors").unlink()
    os.symlink(outside, snapshot / "model.safetensors")
    with pytest.raises(ConfigError, match="outside the checkpoint folder and its hub cache"):
        TensorFiles(snapshot)


def test_a_blobs_folder_that_links_elsewhere_is_refused(tmp_path):
    snapshot = _llama_snapshot(tmp_path)
    blobs = snapshot.parents[1] / "blobs"
    moved = shutil.move(blobs, tmp_path / "moved")
    os.symlink(moved, blobs)
    with pytest.raises(ConfigError, match="outside the checkpoint folder"):
        TensorFiles(snapshot)


def test_a_missing_blob_is_named(tmp_path):
    snapshot = _llama_snapshot(tmp_path)
    (snapshot / "model.safetensors").resolve().unlink()
    with pytest.raises(ConfigError, match=r"model\.safetensors is missing \(a symlink to "):
        TensorFiles(snapshot)


def test_a_single_file_is_named_not_an_index(tmp_path):
    folder = Path(shutil.copytree(FIXTURES / "llama", tmp_path / "llama"))
    outside = tmp_path / "elsewhere.safetensors"
    shutil.move(folder / "model.safetensors", outside)
    os.symlink(outside, folder / "model.safetensors")
    with pytest.raises(ConfigError) as info:
        TensorFiles(folder)
    assert "index" not in str(info.value)
    assert str(info.value).startswith(f"{folder / 'model.safetensors'}: 'model.safetensors' "
                                      "resolves to"), str(info.value)


# ---- data_offsets tile the data --------------------------------------------------------


def _rewritten(tmp_path, edit, extra=b""):
    """The llama fixture's file with its header edited by ``edit(header)``."""
    raw = (FIXTURES / "llama" / "model.safetensors").read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    head = json.loads(raw[8:8 + n])
    edit(head)
    text = json.dumps(head).encode()
    path = tmp_path / "model.safetensors"
    path.write_bytes(struct.pack("<Q", len(text)) + text + raw[8 + n:] + extra)
    return path


def _by_offset(head):
    return sorted((k for k in head if k != "__metadata__"),
                  key=lambda k: head[k]["data_offsets"])


def _copy_span(head, name, other):
    """Give ``name`` the offsets of ``other``, a tensor of the same byte size."""
    assert np.diff(head[name]["data_offsets"]) == np.diff(head[other]["data_offsets"])
    head[name]["data_offsets"] = list(head[other]["data_offsets"])


def test_overlapping_tensors_are_refused(tmp_path):
    def edit(head):   # the two layers' input norms share their bytes
        _copy_span(head, "model.layers.1.input_layernorm.weight",
                   "model.layers.0.input_layernorm.weight")
    with pytest.raises(ConfigError, match=r"model\.safetensors: 'model\.layers\.\d\.input_"
                                          r"layernorm\.weight': data_offsets \[.*\] overlap "):
        read_header(_rewritten(tmp_path, edit), "model.safetensors")


def test_a_gap_and_trailing_bytes_are_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"leave bytes \[0, 2\) after the start of the data"):
        read_header(_rewritten(tmp_path, _shift_first), "model.safetensors")
    with pytest.raises(ConfigError, match="data ends at byte .* trailing bytes"):
        read_header(_rewritten(tmp_path, lambda h: None, extra=b"\0" * 16), "model.safetensors")


def _shift_first(head):
    """The first tensor (by offset) starts 2 bytes late; the one it overlapped
    then is dropped, so only the gap is wrong."""
    first, second = _by_offset(head)[:2]
    begin, end = head[first]["data_offsets"]
    head[first]["data_offsets"] = [begin + 2, end + 2]
    del head[second]


def test_a_bad_entry_is_named_by_tensor(tmp_path):
    def edit(head):
        head["model.norm.weight"]["shape"] = "big"
    with pytest.raises(ConfigError, match=r"'model\.norm\.weight'.*shape"):
        read_header(_rewritten(tmp_path, edit), "model.safetensors")


@pytest.mark.parametrize("n", [limits.MAX_SAFETENSORS_HEADER + 1, 91_000_000],
                         ids=["limit+1", "91MB"])
def test_a_header_over_the_limit_is_refused_before_it_is_read(tmp_path, n):
    """A header over MAX_SAFETENSORS_HEADER (91 MB took 31 s and 1.4 GB before
    its error) in a file long enough to hold it (sparse: its bytes are never
    read) is refused from its 8-byte length, in well under 2 s, and
    tracemalloc's peak stays under 1 MiB."""
    path = tmp_path / "model.safetensors"
    path.write_bytes(struct.pack("<Q", n))
    os.truncate(path, 8 + n)
    tracemalloc.start()
    start = time.perf_counter()
    try:
        with pytest.raises(ConfigError, match=f"limit \\({limits.MAX_SAFETENSORS_HEADER:,}\\)"):
            read_header(path, "model.safetensors")
        seconds, peak = time.perf_counter() - start, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert seconds < 2 and peak < 2**20, (seconds, peak)
