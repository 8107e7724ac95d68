"""YaRN rope scaling: frequencies, the cos/sin attention factor and DeepSeek's
softmax mscale, against the numbers written in tests/fixtures/hf/README.md
("Facts checked against transformers 5.24") and models-wave2.md section 3."""

import math

import numpy as np
import pytest

from megakernel.errors import IRError
from megakernel.ir.ops import Rope, RopeScaling, rope_attention_factor, rope_inv_freq


def _yarn(**kw):
    base = dict(rope_type="yarn", factor=40.0, beta_fast=32.0, beta_slow=1.0,
                original_max_position=4096)
    return RopeScaling(**{**base, **kw})


def test_deepseek_fixture_frequencies():
    """d = 8, theta 1e4, factor 40: frequencies 0, 1 unscaled, 2 half-blended,
    3 divided by 40 (the fixture README)."""
    plain = 1.0 / 1e4 ** (np.arange(0, 8, 2) / 8)
    got = rope_inv_freq(1e4, 8, _yarn(mscale=1.0, mscale_all_dim=0.8))
    np.testing.assert_allclose(got[:2], plain[:2], rtol=1e-12)
    np.testing.assert_allclose(got[2], 0.5 * plain[2] + 0.5 * plain[2] / 40, rtol=1e-12)
    np.testing.assert_allclose(got[3], plain[3] / 40, rtol=1e-12)


def test_attention_factor_and_softmax_mscale():
    fixture = _yarn(mscale=1.0, mscale_all_dim=0.8)
    assert rope_attention_factor(fixture) == pytest.approx(1.05697, abs=1e-5)
    assert fixture.softmax_mscale() == pytest.approx(1.29511 ** 2, rel=1e-5)
    assert 24 ** -0.5 * fixture.softmax_mscale() == pytest.approx(0.342380, abs=1e-6)
    public = _yarn(mscale=1.0, mscale_all_dim=1.0)          # DeepSeek-V3's config
    assert rope_attention_factor(public) == 1.0
    assert 192 ** -0.5 * public.softmax_mscale() == pytest.approx(0.135234, abs=1e-6)
    k2 = _yarn(factor=32.0, beta_fast=1.0, mscale=1.0, mscale_all_dim=1.0)
    assert 192 ** -0.5 * k2.softmax_mscale() == pytest.approx(0.130861, abs=1e-6)
    gpt_oss = _yarn(factor=32.0, truncate=False)            # no mscale keys: g(factor)
    explicit = _yarn(attention_factor=1.5, mscale=1.0, mscale_all_dim=0.8)
    assert rope_attention_factor(explicit) == 1.5           # an explicit factor wins
    assert rope_attention_factor(gpt_oss) == pytest.approx(0.1 * math.log(32) + 1)
    assert gpt_oss.softmax_mscale() == 1.0
    assert rope_attention_factor(RopeScaling("linear", 2.0)) == 1.0


def test_truncate_rounds_the_correction_range():
    """Without truncation the ramp starts at the exact correction dimension."""
    d, theta, orig = 64, 150000.0, 4096
    corr = lambda n: d * math.log(orig / (n * 2 * math.pi)) / (2 * math.log(theta))  # noqa: E731
    lo, hi = corr(32.0), corr(1.0)
    ramp = np.clip((np.arange(d // 2) - lo) / (hi - lo), 0, 1)
    plain = 1.0 / theta ** (np.arange(0, d, 2) / d)
    want = plain / 32 * ramp + plain * (1 - ramp)
    got = rope_inv_freq(theta, d, _yarn(factor=32.0, truncate=False))
    np.testing.assert_allclose(got, want, rtol=1e-12)
    assert not np.allclose(rope_inv_freq(theta, d, _yarn(factor=32.0)), want)


def test_rope_op_carries_the_factor():
    op = Rope(2, 16, 1e4, 8, _yarn(mscale=1.0, mscale_all_dim=0.8))
    assert op.attention_factor() == pytest.approx(1.05697, abs=1e-5)
    assert Rope(2, 16).attention_factor() == 1.0


def test_unknown_rope_type_is_named():
    with pytest.raises(IRError, match="rope_type"):
        RopeScaling("dynamic", 2.0)
