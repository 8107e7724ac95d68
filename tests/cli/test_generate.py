"""Greedy generation: reference prefill, then kernel calls of N steps each."""

import numpy as np
import pytest

from megakernel.cli import main
from megakernel.cli.generation import generate, reference_greedy
from megakernel.models.weights import init_weights

from tests.e2e.test_decode import dense


def test_generate_matches_reference_greedy_with_an_end_id():
    """7 tokens in 2 calls of 3 steps (the second cut by the length limit); an
    end id taken from the free continuation stops row 0 in the first call."""
    model = dense()
    w = init_weights(model, 0)
    prompt = [[1, 2, 3], [7, 8, 9]]
    free = reference_greedy(model, w, prompt, 7)
    end = int(free[0, 2])
    got = generate(model, prompt, 7, steps_per_call=3, weights=w, end_id=end)
    want = reference_greedy(model, w, prompt, 7, end_id=end)
    assert got.calls == 2
    np.testing.assert_array_equal(got.tokens, want)
    assert (got.tokens[0, 2:] == end).all()


def test_a_row_ends_on_any_of_several_end_ids():
    """Checkpoints name several end ids (Llama 3, Qwen3): the kernel stops a
    row on the first, the host on the others; either way the row's later
    tokens repeat the id it ended on, as in the reference's loop."""
    from megakernel.cli.generation import reference_greedy

    model = dense()
    w = init_weights(model, 0)
    prompt = [[1, 2, 3], [7, 8, 9]]
    free = reference_greedy(model, w, prompt, 7)
    first = int(free[0, 2])
    other = next(int(t) for t in free[1, 1:] if t not in free[0, :3] and t != free[1, 0])
    ends = (first, other)
    got = generate(model, prompt, 7, steps_per_call=6, weights=w, end_id=ends)
    want = reference_greedy(model, w, prompt, 7, end_id=ends)
    np.testing.assert_array_equal(got.tokens, want)
    assert (got.tokens[0, 2:] == first).all()
    at = list(free[1]).index(other)
    assert (got.tokens[1, at:] == other).all() and (got.tokens[1, :at] == free[1, :at]).all()


def test_cli_generate_prints_tokens_that_match(capsys):
    code = main(["generate", "tiny-dense", "--random-weights", "--prompt-ids", "1,2,3", "4,5,6", "--max-new", "5",
                 "--steps-per-call", "4"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert out.count("row ") == 2 and "MATCH: 1 kernel call(s) of 4 steps" in out


@pytest.mark.parametrize("argv, needle", [
    (["generate", "tiny-dense", "--random-weights", "--prompt-ids", "1,2", "3", "--max-new", "4"], "one length"),
    (["generate", "tiny-dense", "--random-weights", "--prompt-ids", "1,99999", "--max-new", "4"], "vocabulary"),
    (["generate", "tiny-dense", "--random-weights", "--prompt-ids", "1", "--max-new", "100000"], "max_seq_len"),
    (["plan", "tiny-dense", "--tokens", "2", "--steps-per-call", "4"], "tokens=1"),
    (["generate", "tiny-dense", "--random-weights", "--prompt-ids", "1", "--max-new", "4", "--end-id", "99999"],
     "end_id"),
])
def test_generate_and_steps_per_call_refuse_bad_input(argv, needle, capsys):
    code = main(argv)
    err = capsys.readouterr()
    assert code == 2 and needle in err.err, err
    assert "row " not in err.out


def test_check_steps_does_not_apply_to_a_multistep_kernel(capsys):
    code = main(["check", "tiny-dense", "--steps-per-call", "4", "--steps", "3"])
    err = capsys.readouterr().err
    assert code == 2 and "--steps" in err and "one call" in err


def test_plan_and_generate_take_the_planners_steps_per_call(capsys):
    """auto: the report gives the N and its rule; generate (default auto) uses
    at most the tokens left after the prefill's (here 2)."""
    code = main(["plan", "tiny-dense", "--steps-per-call", "auto"])
    out = capsys.readouterr().out
    assert code == 0 and "steps_per_call: auto: " in out and "of the step" in out
    code = main(["generate", "tiny-dense", "--random-weights", "--prompt-ids", "1,2,3", "--max-new", "3"])
    out = capsys.readouterr().out
    assert code == 0 and "MATCH: 1 kernel call(s) of 2 steps" in out, out
    with pytest.raises(SystemExit):
        main(["plan", "tiny-dense", "--steps-per-call", "many"])
    assert "give an integer in 1..128, or auto" in capsys.readouterr().err


@pytest.mark.slow   # 25 s on 2 cores: a kernel emitted and interpreted twice
def test_generate_with_one_step_per_call(capsys):
    """A one-step kernel has no stop-rule operands (issue 33: KeyError
    'end_id'): 3 tokens in 2 calls of 1 step, matching the reference."""
    code = main(["generate", "tiny-dense", "--random-weights", "--prompt-ids", "1,2,3", "--max-new", "3",
                 "--steps-per-call", "1"])
    out = capsys.readouterr().out
    assert code == 0 and "MATCH: 2 kernel call(s) of 1 steps" in out, out


def test_auto_takes_one_step_when_one_token_is_left():
    """--max-new 2 leaves one token after the prefill's: auto plans 1 step."""
    from megakernel.cli.generation import plan_for
    from megakernel.models import zoo

    assert plan_for(zoo.model("tiny-dense"), [[1, 2, 3]], 2).request.steps == 1


def test_a_prompt_longer_than_max_seq_len_says_so(capsys):
    ids = ",".join(["1"] * 600)          # tiny-dense holds 512 positions
    code = main(["generate", "tiny-dense", "--random-weights", "--prompt-ids", ids, "--max-new", "1"])
    err = " ".join(capsys.readouterr().err.split())
    assert code == 2 and "a prompt of 600 ids leaves no room" in err, err
    assert "at most 511 ids" in err and "-8" not in err


def test_generate_plans_before_decoding_the_reference(capsys, monkeypatch):
    """A plan the cores refuse is refused before any reference decoding."""
    from megakernel.cli import generation

    def decoded(*a, **k):
        raise AssertionError("the reference decoded before planning")

    monkeypatch.setattr(generation, "reference_greedy", decoded)
    code = main(["generate", "tiny-moe", "--random-weights", "--prompt-ids", "1,2", "3,4", "--max-new", "4",
                 "--devices", "3"])
    err = capsys.readouterr().err
    assert code == 2 and "cannot be split evenly over 3" in err, err
