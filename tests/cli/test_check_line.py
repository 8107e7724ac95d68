"""`megakernel check`'s result line says what its tolerances are relative to:
each bound is the dtype's relative bound times (1 + the largest reference
value), and the line gives both factors, which multiply back to the bound."""

import re

import pytest

from megakernel.backends.pallas_tpu.check.against_reference import CheckResult, Tolerances
from megakernel.cli.commands import check_line


def _result(**kw):
    bounds = Tolerances(2e-2, 2 ** -7, 1e-4)
    scale, cache_scale = 341.5, 7.25
    base = dict(max_abs_err=0.012, token_agreement=1.0, cache_max_err=0.0078, steps=2,
                seconds=1.0, tolerance=bounds.logits * (1 + scale),
                cache_tolerance=bounds.state * (1 + cache_scale), bounds=bounds,
                logit_scale=scale, cache_scale=cache_scale)
    return CheckResult(**{**base, **kw})


def read_tolerances(line: str) -> list[tuple[float, float, float]]:
    """(bound, relative bound, scale) of each tolerance the line states."""
    return [tuple(map(float, m)) for m in re.findall(
        r"tolerance ([\d.e+-]+) = ([\d.e+-]+) x \(1 \+ ([\d.e+-]+), the largest \|reference", line)]


def test_the_tolerances_say_what_they_scale_by():
    result = _result()
    line = check_line(result)
    assert line.startswith("PASS")
    (logits, state) = read_tolerances(line)
    assert "the largest |reference logit|" in line and "the largest |reference state" in line
    for (bound, rel, scale), want in ((logits, result.tolerance), (state, result.cache_tolerance)):
        assert bound == pytest.approx(want, rel=1e-2)
        assert rel * (1 + scale) == pytest.approx(want, rel=1e-2)


def test_a_result_without_bounds_gives_the_bare_tolerance():
    """A run stopped by a race has no reference scale: no made-up factors."""
    line = check_line(_result(bounds=None, races=True))
    assert "FAIL" in line and "tolerance" in line and not read_tolerances(line)
