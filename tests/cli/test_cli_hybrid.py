"""The megakernel command on the hybrid linear-attention models: the zoo cards
and a Qwen3.5 checkpoint folder (the committed fixture), through show, plan,
compile, check and aot."""

from pathlib import Path

import pytest

from tests.cli.helpers import run

FIXTURE = Path(__file__).parents[1] / "fixtures" / "hf" / "qwen3_5"


def test_show_and_plan_the_zoo_cards(capsys):
    code, out, _ = run("show", "qwen3.5-27b", capsys=capsys)
    assert code == 0 and "26,895,998,464" in out
    assert "recurrent state: 153,944,064 bytes per sequence" in out
    code, out, _ = run("show", "qwen3-next-80b-a3b", capsys=capsys)
    assert code == 0 and "recurrent state" in out
    code, out, _ = run("plan", "qwen3.5-27b", "--devices", "8", capsys=capsys)
    assert code == 0
    # every state byte in the report: the conv histories and the f32 recurrent
    # state, of the 48 GDN layers (the body's run of 3, looped, x 16)
    assert ("l0_gdn.recurrent (whole state): 48x1x6x128x128 float32, 18.00 MiB per core, "
            "split over the cores") in out
    assert "l0_gdn.hist_v (whole state): 48x1x3x768 bfloat16" in out


def test_checkpoint_folder_compiles_checks_and_aot_compiles(tmp_path, capsys):
    code, out, _ = run("show", str(FIXTURE), capsys=capsys)
    assert code == 0 and "recurrent state" in out
    out_dir = tmp_path / "q35"
    code, out, err = run("compile", str(FIXTURE), "--devices", "1", "-o", str(out_dir),
                         capsys=capsys)
    assert code == 0, err
    code, out, err = run("check", str(out_dir), capsys=capsys)
    assert code == 0, err
    assert out.startswith("PASS")
    pytest.importorskip("libtpu")
    code, out, err = run("aot", str(out_dir), capsys=capsys)
    assert code == 0, err
    assert "VMEM used" in out


def test_generate_on_the_checkpoint_folder_matches_the_reference(capsys):
    """Greedy tokens of the hybrid's own weights (the prefill's token, then
    one call of 3 steps carrying the Gated DeltaNet states) equal the
    reference's continuation and transformers' (greedy.json)."""
    from tests.cli.test_generate_checkpoint import greedy, printed_rows, prompt_args

    record = greedy(FIXTURE.name)
    code, out, err = run("generate", str(FIXTURE), *prompt_args(record), "--max-new", "4",
                         "--steps-per-call", "3", "--dtype", "float32", capsys=capsys)
    assert code == 0, err
    assert "MATCH: 1 kernel call(s) of 3 steps" in out, out
    assert printed_rows(out) == [row[:4] for row in record["greedy_ids"]]
