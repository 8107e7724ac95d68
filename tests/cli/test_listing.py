"""`megakernel list`, `show --layers`, `--version`, and "did you mean" for a
near-miss zoo name or card field (issue 33)."""

import pytest

from megakernel.cli import main
from megakernel.cli.artifact import version
from megakernel.errors import IRError
from megakernel.ir.card import ModelConfig
from megakernel.models import zoo


def run(*argv, capsys):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, " ".join(out.err.split())


def test_list_gives_each_zoo_model_one_line(capsys):
    code, out, _ = run("list", capsys=capsys)
    lines = {line.split()[0]: line for line in out.splitlines()}
    assert code == 0 and sorted(lines) == zoo.names()
    assert "MoE 8x top-2" in lines["tiny-moe"] and "3 layers" in lines["tiny-moe"]
    assert "MLA" in lines["deepseek-v3"] and "671.0B params" in lines["deepseek-v3"]


def test_version_comes_from_the_package(capsys):
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0 and capsys.readouterr().out.strip() == f"megakernel {version()}"


def test_show_cuts_layers_like_the_other_commands(capsys):
    code, out, _ = run("show", "tiny-moe", "--layers", "1", capsys=capsys)
    assert code == 0 and ", 1 layers," in out
    code, _, err = run("show", "tiny-moe", "--layers", "9", capsys=capsys)
    assert code == 2 and "9 is more than the 3 layers tiny-moe has" in err


def test_a_near_miss_zoo_name_gets_a_suggestion(capsys):
    code, _, err = run("show", "tiny-dens", capsys=capsys)
    assert code == 2 and "did you mean 'tiny-dense'?" in err and "qwen3-32b" not in err, err
    with pytest.raises(IRError, match="did you mean 'qwen3-8b'"):
        zoo.card("qwen3-8c")


@pytest.mark.parametrize("field, value, guess", [
    ("num_layer", 2, "'num_layers' for 'num_layer'"),
    ("moe", {"num_expert": 8, "top_k": 2, "expert_intermediate": 64},
     "'num_experts' for 'num_expert'"),
])
def test_a_misspelled_card_field_gets_a_suggestion(field, value, guess):
    data = zoo.card("tiny-dense").to_dict()
    data[field] = value
    if field == "num_layer":
        del data["num_layers"]
    with pytest.raises(IRError) as info:
        ModelConfig.from_dict(data)
    assert f"did you mean {guess}?" in str(info.value)
    assert "known:" not in str(info.value)
