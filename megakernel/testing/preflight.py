"""Checks of the environment a kernel check needs, made before a case runs.

Too few virtual devices, no libtpu for an AOT compile, a model that does not
plan for the requested TensorCores: these are the user's set-up, not
properties of a drawn case, so each raises ``SetupError`` at once, naming what
was expected, what was found and what to set.

Inside a hypothesis test the error travels in ``SetupAbort``. Hypothesis
catches ``Exception`` (and ``SystemExit``, ``GeneratorExit``, pytest's
``Failed``) from a test body and treats it as a counterexample: it would
draw and shrink "need 2 devices, found 1" until its budget ran out. Every
other ``BaseException`` it lets through at once, as pytest's own outcome
exceptions are built to be; the pytest plugin reports a ``SetupAbort`` as
the set-up error it carries, and ``check_examples`` re-raises that error.
"""

from __future__ import annotations

import importlib.util
import sys
from typing import NoReturn

from megakernel import virtual_devices
from megakernel.errors import PlanningError, SetupError, ShardingError


class SetupAbort(BaseException):
    """Carries a SetupError out of a hypothesis search (see the module's docstring)."""

    def __init__(self, error: SetupError):
        super().__init__(str(error))
        self.error = error


def fail(error: SetupError) -> NoReturn:
    """Raise ``error``; inside a hypothesis test, wrapped in SetupAbort."""
    hypothesis = sys.modules.get("hypothesis")
    if hypothesis is not None and hypothesis.currently_in_test_context():
        raise SetupAbort(error) from error
    raise error


def require_devices(n: int, *, mesh=None) -> None:
    """At least ``n`` devices for an ``n``-core kernel (or a ``mesh`` of exactly n)."""
    if mesh is not None:
        if mesh.devices.size != n:
            fail(SetupError(f"the mesh has {mesh.devices.size} devices, expected {n}",
                            path="check.mesh", hint=f"pass a mesh of {n} devices, or "
                            "leave out devices= (the mesh's size is used)"))
        return
    have = virtual_devices.available()
    if have < n:
        fail(SetupError(
            f"need {n} devices for a {n}-core kernel, found {have}",
            path="check.devices",
            hint=f"{virtual_devices.how_to_ask(n)}; the count is fixed when jax first "
                 "runs, so setting it later in the process has no effect"))


_PLANNED: dict = {}


def require_plan(model, devices: int):
    """The plan of one sequence and one token on ``devices`` cores -> Plan.

    A model whose heads, experts or weights do not split over ``devices`` fails
    here, before any case is drawn; a plan that fails only for a larger drawn
    batch is left to the property, where it shrinks to the smallest batch."""
    from megakernel.testing import kernel_cache

    key = (model, devices)
    if key not in _PLANNED:
        try:
            _PLANNED[key] = kernel_cache.plan(model, devices, 1, 1)
        except (ShardingError, PlanningError) as err:
            _PLANNED[key] = SetupError(
                f"{model.name} does not plan for {devices} TensorCore(s): {err}",
                path="check.devices",
                hint=f"check it on a core count its heads and experts split over, or "
                     f"change the model (model_configs(cores={devices}) draws ones that "
                     "split)")
    found = _PLANNED[key]
    if isinstance(found, SetupError):   # a fresh error each time: no stacked tracebacks
        fail(SetupError(found.message, path=found.path, hint=found.hint))
    return found


def require_libtpu() -> None:
    """libtpu, the TPU compiler that AOT checks run (no TPU needed)."""
    if importlib.util.find_spec("libtpu") is None:
        fail(SetupError(
            "an AOT compile needs libtpu (the TPU7x compiler), which is not installed "
            f"in {sys.prefix}", path="aot.libtpu",
            hint="pip install 'megakernel[tpu-aot]' (libtpu==0.0.51), or `make test`, "
                 "which installs it"))


def require_topology(topology: str, chip: str, cores: int) -> None:
    """``topology`` is one of ``chip``'s, with at least ``cores`` TensorCores."""
    from megakernel import chips
    from megakernel.errors import EmitError

    if topology not in chips.TOPOLOGIES:
        fail(SetupError(f"{topology!r} is not a topology this project compiles for",
                        path="aot.topology", hint="use one of " + ", ".join(chips.TOPOLOGIES)))
    try:
        chips.check_topology(topology, chip, cores)
    except EmitError as err:
        fail(SetupError(err.message, path="aot.topology", hint=err.hint))
