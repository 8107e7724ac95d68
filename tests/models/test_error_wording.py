"""Errors name the right thing once (issue 33): no doubled words, a bad value
reported as bad (not also as missing), a value shown as it was written."""

import json

import pytest

from megakernel.errors import MegakernelError
from megakernel.ir.card import ModelConfig
from megakernel.models import zoo
from megakernel.models.hf import from_hf

LLAMA = "tests/fixtures/hf/llama/config.json"


def llama(**changes) -> dict:
    data = json.loads(open(LLAMA).read())
    data.update(changes)
    return data


def message(fn, *args) -> str:
    with pytest.raises(MegakernelError) as info:
        fn(*args)
    return str(info.value)


@pytest.mark.parametrize("name", ["9lives", "class"])
def test_a_bad_name_says_expected_once(name):
    data = {**zoo.card("tiny-dense").to_dict(), "name": name}
    text = message(ModelConfig.from_dict, data)
    assert "expected expected" not in text and "expected a name" in text, text
    assert repr(name) in text


@pytest.mark.parametrize("factor, words", [("two", "'two' should be a number"),
                                           (-1.0, "expected a value > 0.0")])
def test_a_bad_rope_factor_is_reported_once_and_not_as_missing(factor, words):
    data = llama()
    data["rope_parameters"] = {**data["rope_parameters"], "factor": factor}
    text = message(from_hf, data)
    assert "(1 problem)" in text and words in text, text
    assert "missing" not in text


def test_an_absent_rope_factor_is_missing():
    data = llama()
    data["rope_parameters"] = {k: v for k, v in data["rope_parameters"].items() if k != "factor"}
    assert "rope_parameters.factor: is required but missing" in message(from_hf, data)


def test_a_model_type_list_is_shown_as_written():
    text = message(from_hf, llama(model_type=["llama"]))
    assert "model_type=['llama'] should be a string" in text, text
    assert "None" not in text
