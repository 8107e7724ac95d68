"""A bf16 wire's bound (backends/pallas_tpu/check/against_reference.py
Tolerances): the attention models' measured bound, or the largest bound a
kind of the model registers in WIRE_TOLERANCE (Gated DeltaNet's)."""

from types import SimpleNamespace

import pytest

from megakernel.backends.pallas_tpu.check.against_reference import (CACHE_TOL, TOL, WIRE_TOL,
                                                                     Tolerances)
from megakernel.models import zoo
from megakernel.models.reference import WIRE_TOLERANCE


def _plan(wire: str, cores: int = 2):
    return SimpleNamespace(collectives=SimpleNamespace(wire=wire),
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
