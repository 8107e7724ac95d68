"""load_model resolves zoo names, card / graph / HF JSON files and HF folders."""

import json
from pathlib import Path

import pytest

from megakernel.errors import IRError
from megakernel.ir.serialize import model_to_json
from megakernel.ir.types import DType
from megakernel.models import load_model, zoo
from megakernel.models.cards import card_to_json

FIXTURES = Path(__file__).parents[1] / "fixtures" / "hf"


def test_zoo_name():
    assert load_model("tiny-moe") == zoo.model("tiny-moe")


def test_card_and_graph_files(tmp_path):
    card, graph = tmp_path / "card.json", tmp_path / "graph.json"
    card.write_text(card_to_json(zoo.card("tiny-dense")))
    graph.write_text(model_to_json(zoo.model("tiny-moe")))
    assert load_model(card) == zoo.model("tiny-dense")
    assert load_model(str(graph)) == zoo.model("tiny-moe")


def test_hf_config_file_and_checkpoint_folder():
    by_file = load_model(FIXTURES / "qwen3_moe" / "config.json")
    by_folder = load_model(FIXTURES / "qwen3_moe")
    assert by_file == by_folder and by_file.name == "qwen3_moe"


def test_dtype_override():
    assert load_model("tiny-dense", dtype="float32").dtype is DType.F32
    assert load_model(FIXTURES / "llama", dtype="float32").dtype is DType.F32


@pytest.mark.parametrize("content", ['{"format": "other/1"}', "[1, 2]", "not json"])
def test_unrecognised_files_say_what_is_accepted(tmp_path, content):
    path = tmp_path / "x.json"
    path.write_text(content)
    with pytest.raises(IRError, match="zoo name.*megakernel.card/1.*config.json"):
        load_model(path)


def test_unknown_name_says_what_is_accepted(tmp_path):
    with pytest.raises(IRError, match="neither a zoo name.*tiny-dense"):
        load_model("llama-9000")
    with pytest.raises(IRError, match="neither"):
        load_model(tmp_path)          # a folder without config.json


def test_bad_card_names_the_file(tmp_path):
    path = tmp_path / "broken.json"
    data = json.loads(card_to_json(zoo.card("tiny-dense")))
    data["hidden_sise"] = 3
    path.write_text(json.dumps(data))
    with pytest.raises(IRError, match=r"broken\.json.*hidden_sise"):
        load_model(path)
