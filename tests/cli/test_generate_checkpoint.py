"""`megakernel generate DIR` decodes the checkpoint's own weights and prints
transformers' greedy continuation of it (tests/fixtures/hf/*/greedy.json,
written by transformers' ``generate``: tools/hf_fixtures/greedy.py)."""

import json
from pathlib import Path

import numpy as np
import pytest

from megakernel.cli import main

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "hf"
FAMILIES = sorted(d.name for d in FIXTURES.iterdir() if (d / "greedy.json").is_file())


def greedy(name: str) -> dict:
    return json.loads((FIXTURES / name / "greedy.json").read_text())


def prompt_args(record: dict) -> list[str]:
    return ["--prompt-ids", *(",".join(map(str, row)) for row in record["prompt_ids"])]


def printed_rows(out: str) -> list[list[int]]:
    return [[int(t) for t in line.split(":", 1)[1].split()]
            for line in out.splitlines() if line.startswith("row ")]


def test_every_fixture_has_its_greedy_continuation():
    """Each parity fixture ships transformers' greedy continuation, far from
    a tie at every step (the margins the generator cut at)."""
    assert len(FAMILIES) == len([d for d in FIXTURES.iterdir() if d.is_dir()]) == 20
    for name in FAMILIES:
        record = greedy(name)
        assert record["cut_before"] is None and len(record["margins"]) == 8, name
        assert min(record["margins"]) >= 1e-3, name


@pytest.mark.parametrize("name", FAMILIES)
def test_the_checkpoints_reference_greedy_is_transformers(name):
    """The weights generate loads from the folder, decoded greedily by the
    plain-JAX reference (the oracle generate's MATCH line holds the kernel
    to), give transformers' tokens for every family."""
    from megakernel.cli import checkpoint_source
    from megakernel.cli.generation import reference_greedy
    from megakernel.models import load_model

    record = greedy(name)
    folder = FIXTURES / name
    model = load_model(str(folder), dtype="float32")
    weights = checkpoint_source.load(checkpoint_source.weights_folder(
        str(folder), random_weights=False), model, 0)
    ends = checkpoint_source.end_ids(folder, model.vocab_size)
    assert ends == (record["eos_token_id"],)
    got = reference_greedy(model, weights.arrays, record["prompt_ids"], 8, ends)
    np.testing.assert_array_equal(got, record["greedy_ids"])


@pytest.mark.parametrize("name, devices", [
    ("llama", 1),
    pytest.param("qwen3_nvfp4", 2, marks=pytest.mark.slow),
    pytest.param("muse_spark_nvfp4", 2, marks=pytest.mark.slow),
])
def test_generate_prints_transformers_greedy_continuation(name, devices, capsys):
    """Through the kernel, in one call of 7 steps: dense on one core; NVFP4
    as shipped (dense and latent-MoE experts) on two."""
    record = greedy(name)
    code = main(["generate", str(FIXTURES / name), *prompt_args(record), "--max-new", "8",
                 "--dtype", "float32", "--devices", str(devices)])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert printed_rows(out) == record["greedy_ids"]
    assert "MATCH" in out and "checkpoint weights of" in out
    assert "interpret mode on CPU" in err


@pytest.mark.parametrize("argv, needle", [
    (["generate", "tiny-dense", "--prompt-ids", "1,2", "--max-new", "2"],
     "without weights"),
    (["generate", str(FIXTURES / "llama"), "--prompt-ids", "1,2", "--max-new", "2",
      "--seed", "3"], "seeds random weights"),
])
def test_weights_are_the_checkpoints_unless_random_ones_are_asked_for(argv, needle, capsys):
    code = main(argv)
    out, err = capsys.readouterr()
    assert code == 2 and needle in err, err
    assert "row " not in out


def test_end_ids_come_from_generation_config_first(tmp_path):
    """transformers reads generation_config.json's eos_token_id (an id or a
    list) before config.json's; a bad one is a named error."""
    from megakernel.cli.checkpoint_source import end_ids
    from megakernel.errors import ConfigError

    (tmp_path / "config.json").write_text(json.dumps({"eos_token_id": 2}))
    assert end_ids(tmp_path, 128) == (2,)
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [5, 2, 5]}))
    assert end_ids(tmp_path, 128) == (5, 2)
    for bad in ("x", [], [1, 500], True):
        (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": bad}))
        with pytest.raises(ConfigError, match="eos_token_id"):
            end_ids(tmp_path, 128)
    (tmp_path / "generation_config.json").write_text(json.dumps({"bos_token_id": 1}))
    assert end_ids(tmp_path, 128) == (2,)
    assert end_ids(None, 128) == ()
