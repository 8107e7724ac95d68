"""A bf16 wire's bound (backends/pallas_tpu/check/against_reference.py
Tolerances): the attention models' measured bound, or the largest bound a
kind of the model registers in WIRE_TOLERANCE (Gated DeltaNet's)."""

from types import SimpleNamespace

import pytest

from megakernel.backends.pallas_tpu.check.against_reference import (CACHE_TOL, ROUTE_TIE, TOL,
                                                                     WIRE_ROUTE_TIE, WIRE_TOL,
                                                                     Tolerances)
from megakernel.models import zoo
from megakernel.models.reference import WIRE_TOLERANCE


def _plan(wire: str, cores: int = 2, all_reduces: int = 3):
    return SimpleNamespace(collectives=SimpleNamespace(wire=wire,
                                                       all_reduces_per_step=all_reduces),
                           shard=SimpleNamespace(cores=cores))


@pytest.mark.parametrize("name, wire_tol", [("qwen3-8b", WIRE_TOL),
                                            ("qwen3.5-27b", 6e-2)])
def test_a_bf16_wire_adds_the_bound_of_the_models_kinds(name, wire_tol):
    model = zoo.model(name)
    t = Tolerances.of(model, _plan("bfloat16"))
    assert (t.logits, t.state) == (TOL["bfloat16"] + wire_tol, CACHE_TOL["bfloat16"] + wire_tol)
    assert Tolerances.of(model, _plan("float32")).logits == TOL["bfloat16"]


def test_gated_deltanet_registers_its_measured_bound():
    assert WIRE_TOLERANCE("gated_deltanet") == 6e-2 > WIRE_TOL


def test_residual_gates_register_their_measured_bound():
    """Muse Spark's unit-scale gated branches take the wire's rounding about
    whole (models/kind_residual_gate.py): the Muse-like card gets 4e-2."""
    from megakernel.ir.config import build
    from tests.muse_like import muse_like

    assert WIRE_TOLERANCE("residual_gate") == 4e-2 > WIRE_TOL
    t = Tolerances.of(build(muse_like(dtype="bfloat16")), _plan("bfloat16"))
    assert t.state == CACHE_TOL["bfloat16"] + 4e-2


def test_the_route_tie_grows_with_the_cores_and_the_steps_all_reduces():
    """Each all-reduce rounds every core's partial once, and the router reads
    the residual every earlier one rounded into: independent roundings, added
    in quadrature (WIRE_ROUTE_TIE's measurement)."""
    model = zoo.model("qwen3-30b-a3b")
    tie = {(c, n): Tolerances.of(model, _plan("bfloat16", c, n)).route_tie
           for c in (2, 8) for n in (3, 9)}
    assert tie[2, 9] == pytest.approx(ROUTE_TIE["bfloat16"] + WIRE_ROUTE_TIE * 18 ** 0.5)
    assert tie[2, 3] < tie[2, 9] < tie[8, 9] and tie[2, 3] < tie[8, 3] < tie[8, 9]
    assert Tolerances.of(model, _plan("float32", 8, 9)).route_tie == ROUTE_TIE["bfloat16"]
