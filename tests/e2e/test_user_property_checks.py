"""megakernel.testing as a user drives it: drawn cases pass; a broken kernel is
caught and shrunk to a small counterexample."""

import pytest

from megakernel.errors import CheckError
from megakernel.models import zoo
from megakernel.testing import check_examples


def test_drawn_cases_pass_on_tiny_moe():
    report = check_examples(zoo.model("tiny-moe").truncated(2), examples=3, devices=2,
                            max_batch=2, max_tokens=2)
    assert report.startswith("3 drawn case(s) agree")


@pytest.mark.parametrize("fault", ["skip_attention_residual"])
def test_injected_fault_is_caught_and_shrunk(fault):
    model = zoo.model("tiny-dense").truncated(1)
    with pytest.raises(CheckError) as info:
        check_examples(model, examples=5, devices=1, max_batch=3, max_tokens=2,
                       fault=fault, shrink_budget=8)
    text = str(info.value)
    assert "counterexample after shrinking" in text
    # Shrunk to one sequence of one token: the smallest case that shows the fault.
    assert "batch=1, tokens=1" in text


@pytest.mark.slow
def test_ten_examples_on_tiny_moe_like_the_cli():
    check_examples(zoo.model("tiny-moe"), examples=10, devices=1)
