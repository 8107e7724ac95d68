"""``check DIR --hf DIR`` with a broken fixture or a MODEL that is not the
fixture: named errors, exit 2, before any kernel is built (issue 33)."""

import shutil
from pathlib import Path

import numpy as np
import pytest

from tests.cli.test_arguments import run

QWEN3 = Path(__file__).parents[1] / "fixtures" / "hf" / "qwen3"   # vocabulary 128


@pytest.fixture
def fixture(tmp_path):
    """A copy of the qwen3 fixture whose expected.npz a test rewrites."""
    folder = tmp_path / "qwen3"
    shutil.copytree(QWEN3, folder)
    return folder


def _arrays():
    with np.load(QWEN3 / "expected.npz") as exp:
        return {k: exp[k] for k in exp.files}


def _write(folder, **changes):
    np.savez(folder / "expected.npz", **{**_arrays(), **changes})


BROKEN = {
    "not a zip": (lambda f: (f / "expected.npz").write_bytes(b"not a zip at all" * 8),
                  "is not a readable .npz archive"),
    "object array": (lambda f: _write(f, logits_decode_1=np.array([{"a": 1}], dtype=object)),
                     "logits_decode_1: cannot be read as a numeric array"),
    "wrong shape": (lambda f: _write(f, logits_prefill=np.ones((2, 5, 64), np.float32)),
                    "logits_prefill: expected shape [2, 5, 128], found [2, 5, 64]"),
    "ids past the vocabulary": (lambda f: _write(f, decode_ids_2=np.full((2, 1), 500, np.int32)),
                                "decode_ids_2: token ids must lie in [0, 128), found 500..500"),
    "float ids": (lambda f: _write(f, prefill_ids=np.ones((2, 5), np.float32)),
                  "prefill_ids: expected integers, found dtype float32"),
    "a missing array": (lambda f: np.savez(f / "expected.npz", **{
        k: v for k, v in _arrays().items() if k != "logits_decode_2"}),
        "the array 'logits_decode_2' is missing"),
}


@pytest.mark.parametrize("name", BROKEN)
def test_a_broken_expected_npz_is_a_named_error(name, fixture, capsys):
    spoil, needle = BROKEN[name]
    spoil(fixture)
    code, err = run(["check", str(fixture), "--hf", str(fixture)], capsys)
    assert code == 2 and needle in err and "Traceback" not in err, err


@pytest.fixture
def never_decoded(monkeypatch):
    import megakernel.testing

    def decoded(*a, **k):
        raise AssertionError("the fixture was decoded")

    monkeypatch.setattr(megakernel.testing, "check_hf_fixture", decoded)


@pytest.mark.parametrize("argv, needle", [
    (["check", "tiny-dense", "--hf", str(QWEN3)], "MODEL 'tiny-dense' is not the fixture folder"),
    (["check", str(QWEN3), "--hf", str(QWEN3), "--batch", "2"], "--batch does not apply to --hf"),
    (["check", str(QWEN3), "--hf", str(QWEN3), "--steps", "5"], "--steps does not apply to --hf"),
])
def test_check_hf_refuses_a_model_or_flag_it_would_ignore(argv, needle, capsys, never_decoded):
    code, err = run(argv, capsys)
    assert code == 2 and needle in err, err


def test_check_hf_takes_the_fixture_or_its_config_as_model(capsys, monkeypatch):
    import megakernel.testing

    monkeypatch.setattr(megakernel.testing, "check_hf_fixture",
                        lambda folder, devices: [("prefill", 0.0)])
    for model in (str(QWEN3), str(QWEN3 / "config.json")):
        code, err = run(["check", model, "--hf", str(QWEN3)], capsys)
        assert code == 0, err
