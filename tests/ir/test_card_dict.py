"""`json.dumps(card.to_dict())` is a card file every command loads (issue 33)."""

import json

import pytest

from megakernel.errors import IRError
from megakernel.ir.card import CARD_FORMAT, ModelConfig
from megakernel.models import load_model, zoo


def test_the_obvious_json_of_a_card_loads(tmp_path):
    card = zoo.card("tiny-moe")
    path = tmp_path / "card.json"
    path.write_text(json.dumps(card.to_dict()))
    assert load_model(str(path)) == zoo.model("tiny-moe")
    assert ModelConfig.from_dict(card.to_dict()) == card


def test_a_dict_of_another_format_is_refused_by_name():
    data = {**zoo.card("tiny-dense").to_dict(), "format": "megakernel.ir/1"}
    with pytest.raises(IRError, match=f"format='megakernel.ir/1', expected '{CARD_FORMAT}'"):
        ModelConfig.from_dict(data)
