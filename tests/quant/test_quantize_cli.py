"""``--quantize KIND=FORMAT`` on the command line: plan shows bytes per format,
compile writes a folder whose model carries the formats, errors name the flag."""

import pytest

from megakernel import formats

from tests.cli.helpers import run


def test_plan_shows_bytes_per_format(capsys):
    code, out, _ = run("plan", "tiny-dense", "--devices", "2", "--quantize", "dense=int4_g32",
                       capsys=capsys)
    assert code == 0
    section = out.split("Weight formats")[1].split("\n\n")[0]
    # tiny-dense/2: per layer 7 matrices of 256 x 256 per core in int4 g32
    # (half a byte + an f32 scale per 32) against 128 KiB each in bf16
    assert "int4_g32" in section and "plain" in section and "0.31" in section


def test_a_plain_plan_has_no_format_section(capsys):
    code, out, _ = run("plan", "tiny-dense", capsys=capsys)
    assert code == 0 and "Weight formats" not in out


def test_compile_records_the_formats_in_the_folder(tmp_path, capsys):
    import json

    out_dir = tmp_path / "q"
    code, _, _ = run("compile", "tiny-dense", "--quantize", "dense=mxfp4", "-o", str(out_dir),
                     capsys=capsys)
    assert code == 0
    assert json.loads((out_dir / "model.json").read_text())["quantize"] == {"dense": "mxfp4"}
    code, _, err = run("check", str(out_dir), "--quantize", "dense=int8", capsys=capsys)
    assert code == 2 and "--quantize does not apply to a compiled folder" in " ".join(err.split())


@pytest.mark.parametrize("flag, needle", [
    ("dense:int8", "--quantize: expected KIND=FORMAT"),
    ("dense=int3", "--quantize.dense: unknown weight format 'int3'"),
    ("embedding=int8", "embedding weights can only be plain"),
])
def test_bad_quantize_flags_are_named(flag, needle, capsys):
    code, _, err = run("plan", "tiny-moe", "--quantize", flag, capsys=capsys)
    assert code == 2
    assert needle in " ".join(err.split())


def test_an_untied_head_takes_a_format(capsys):
    """The LM head streams through the ring like a dense weight (it was refused
    until its kernel path read quantized tiles: tests/quant/test_quantized_head.py)."""
    code, out, _ = run("plan", "tiny-moe", "--quantize", "lm_head=int8", capsys=capsys)
    assert code == 0 and "hbm.lm_head_scale" in out


@pytest.mark.parametrize("flags, needle", [
    (["experts=int8"], "--quantize.experts: tiny-dense has no experts weights (a MoE layer's"),
    (["attention=int8"], "tiny-dense has no attention weights (an MLA layer's"),
    (["attention=int8"], "other attention projections are dense"),
    (["dense=int8", "dense=int4_g32"], "dense is given twice (dense=int8, then dense=int4_g32)"),
])
def test_quantize_names_a_kind_the_model_has_once(flags, needle, capsys):
    """Issue 33: these were accepted silently (the first two even changed the
    plan digest) or spoke of the MLA library to a model without MLA."""
    argv = ["plan", "tiny-dense"] + [a for f in flags for a in ("--quantize", f)]
    code, _, err = run(*argv, capsys=capsys)
    assert code == 2 and needle in " ".join(err.split()), err


def test_the_kinds_help_offers_are_accepted(capsys):
    """Every kind --help names as an example plans (lm_head was offered, then refused)."""
    import re

    with pytest.raises(SystemExit):
        run("plan", "--help", capsys=capsys)
    text = " ".join(capsys.readouterr().out.split())
    offered = re.search(r"store a weight kind \(([^)]*)\)", text).group(1)
    kinds = [k for k in re.findall(r"[a-z_]+", offered) if k in formats.KINDS]
    assert kinds == ["dense", "experts"], offered
    for kind in kinds:
        code, _, err = run("plan", "tiny-moe", "--quantize", f"{kind}=int8",
                           "--steps-per-call", "1", capsys=capsys)
        assert code == 0, err


def test_a_model_too_big_for_its_cores_is_offered_a_format(capsys):
    """kimi-k2 fits 16 cores only with MXFP4 experts (docs/formats.md): the
    refusal says so."""
    code, _, err = run("plan", "kimi-k2", "--devices", "16", capsys=capsys)
    err = " ".join(err.split())
    assert code == 2 and "--quantize experts=mxfp4" in err and "even split" not in err, err
