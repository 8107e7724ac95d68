"""The token check's near-tie rule (backends/pallas_tpu/check/against_reference.py near_ties),
on logits built by hand: a swap of two reference logits closer than twice
the kernel's error is a near-tie; a wider gap, or a token that is not the
kernel's own argmax, is a mismatch."""

import numpy as np

from megakernel.backends.pallas_tpu.check.against_reference import CheckResult, near_ties


def _logits():
    ref = np.array([[[0.0, 1.00, 0.99, -1.0]], [[2.0, 0.0, 0.0, 0.0]]], np.float32)
    got = ref.copy()
    got[0, 0, 2] += 0.02         # error 0.02 >= half the 0.01 gap: tokens 1, 2 swap
    return ref, got


def test_a_swap_within_twice_the_error_is_a_near_tie():
    ref, got = _logits()
    assert near_ties(np.array([[2], [0]]), got, ref) == (1, 1)
    assert near_ties(np.array([[1], [0]]), got, ref) == (0, 0)


def test_a_wider_gap_or_a_token_off_the_kernels_argmax_is_a_mismatch():
    ref, got = _logits()
    got[0, 0, 2] = ref[0, 0, 2] + 0.004      # error 0.004 < half the gap
    assert near_ties(np.array([[2], [0]]), got, ref) == (1, 0)
    ref, got = _logits()
    # token 3 is not the kernel's argmax (its logits say 2): the argmax is wrong
    assert near_ties(np.array([[3], [0]]), got, ref) == (1, 0)
    assert near_ties(np.array([[2], [3]]), got, ref) == (2, 1)


def test_tokens_agree_needs_every_mismatch_explained():
    base = dict(max_abs_err=0.0, cache_max_err=0.0, steps=1, seconds=0.0, tolerance=1.0,
                cache_tolerance=1.0)
    assert CheckResult(token_agreement=0.5, mismatches=1, near_ties=1, **base).ok
    assert not CheckResult(token_agreement=0.5, mismatches=2, near_ties=1, **base).ok
    # a result that counted no ties (a multi-step call's) needs every token
    assert not CheckResult(token_agreement=0.5, **base).ok
