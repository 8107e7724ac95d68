"""The megakernel command on the MLA models: the zoo cards and a DeepSeek-V3
checkpoint folder (the committed fixture)."""

from pathlib import Path

from tests.cli.helpers import run

FIXTURE = Path(__file__).parents[1] / "fixtures" / "hf" / "deepseek_v3"


def test_show_the_zoo_cards(capsys):
    code, out, _ = run("show", "deepseek-v3", capsys=capsys)
    assert code == 0
    assert "0-2        mla_dense  x3" in out and "3-60       mla_moe    x58" in out
    assert "671,026,419,200" in out and "70,272 bytes per token" in out
    code, out, _ = run("show", "kimi-k2", capsys=capsys)
    assert code == 0 and "1,026,408,232,448" in out


def test_plan_kimi_k2_on_32_cores(capsys):
    code, out, _ = run("plan", "kimi-k2", "--devices", "32", capsys=capsys)
    assert code == 0
    assert "mla.latent (append state): 60x1x4096x576 bfloat16" in out
    assert "mla s1.mla: absorbed form" in out and "modeled" in out


def test_checkpoint_folder_shows_plans_compiles_and_checks(tmp_path, capsys):
    code, out, _ = run("show", str(FIXTURE), capsys=capsys)
    assert code == 0 and "mla heads=4 kv_lora_rank=32" in out and "n_group=2" in out
    out_dir = tmp_path / "ds"
    code, out, err = run("compile", str(FIXTURE), "--devices", "2", "--batch", "2", "-o",
                         str(out_dir), capsys=capsys)
    assert code == 0, err
    assert "mla_lib.attend(" in (out_dir / "kernel.py").read_text()
    code, out, err = run("check", str(out_dir), capsys=capsys)
    assert code == 0, err
    assert out.startswith("PASS")


def test_published_fp8_config_imports_its_shipped_formats(tmp_path, capsys):
    """DeepSeek-V3's published config ships fp8 blocks: it imports (it was
    refused before issue 13's shipped loaders) with its dense and expert
    matrices in fp8_b128, and a quantization_config this project cannot read
    is still refused by name (exit 2)."""
    import json

    from tests.models.published_configs import DEEPSEEK_V3

    path = tmp_path / "config.json"
    path.write_text(json.dumps(DEEPSEEK_V3))
    code, _, err = run("show", str(path), capsys=capsys)
    assert code == 0, err
    from megakernel.models.hf import from_hf

    card = from_hf(path)
    assert (card.quantize.dense, card.quantize.experts) == ("fp8_b128", "fp8_b128")
    bad = dict(DEEPSEEK_V3, quantization_config={"quant_method": "awq"})
    path.write_text(json.dumps(bad))
    code, _, err = run("show", str(path), capsys=capsys)
    text = " ".join(err.split())          # the printer wraps long lines
    assert code == 2 and "quantization_config" in text and "awq" in text
