"""The check every drawn-model property test makes of one plan (helper, not
a test module): the kernel in strict interpret mode against the reference."""

from hypothesis import strategies as st
from jax.experimental.pallas import tpu as pltpu

from megakernel.backends.pallas_tpu.check.kernel_check import check as check_kernel
from megakernel.models.weights import init_weights


def past_the_simplest(strategy):
    """``strategy`` with hypothesis' simplest example ruled out. In the generate
    phase hypothesis tries the simplest example first (every choice its first:
    one layer, batch 1, one token, ...), so a test of one or two examples would
    check that same case in every run; a leading draw that rejects the all-first
    choice makes every example a random one. The simplest cases are the
    hand-picked ones of test_decode.py and the op tests."""
    return st.tuples(st.booleans().filter(bool), strategy).map(lambda drawn: drawn[1])


def assert_plan_matches_reference(model, plan):
    """Two decode steps: no race, the same greedy tokens, logits within the
    check's tolerance and every cache (KV or latent) within its state
    tolerance (new rows are computed on both sides: an ulp flip at most).
    A sequence the reference routes by a near-tie is not compared (run.py
    ROUTE_TIE). -> the CheckResult."""
    try:
        result = check_kernel(model, plan, init_weights(model, seed=1), steps=2, seed=2)
    finally:
        pltpu.reset_tpu_interpret_mode_state()
    assert not result.races, "the race detector reported a race"
    # A drawn model may put two logits a rounding apart: such a near-tie is
    # bounded by the logits check, every other token must agree.
    assert result.tokens_agree, result
    assert result.max_abs_err <= result.tolerance, result
    assert result.cache_max_err <= result.cache_tolerance, result
    assert result.ok, result
    return result
