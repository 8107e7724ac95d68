"""Which state-owning op kinds carry their state across the steps of one call.

``STEPPING``: for each state-owning op kind, whether its kernel library
runs inside a multi-step call (``steps_per_call`` > 1), i.e. follows the stop
rule of backends/pallas_tpu/kernels/step_loop.py, and how. The planner refuses
``steps_per_call`` > 1 for a kind that says it does not (compiler/request.py,
choose_steps.py), and a state-owning kind with no rule is a
``MissingRuleError``. Stateless kinds need none: nothing of theirs outlives a
step. The table lives here, below the kernel libraries, so the planner reads
it without importing kernel code.
"""

from __future__ import annotations

from dataclasses import dataclass

from megakernel.registry import Registry


@dataclass(frozen=True)
class Stepping:
    """How a state-owning kind's library behaves over the N steps of one call:
    ``carries`` - it takes ``stopped`` and the step's positions and leaves a
    stopped sequence's state unchanged; ``how`` - what it does (the report),
    or, when it does not carry, why and what would change that."""

    carries: bool
    how: str


# Keyed by the op kinds that own state (Op.state non-empty), not by every kind.
STEPPING: Registry[Stepping] = Registry(
    "multi-step", "compiler/stepping.py or compiler/kind_<name>.py",
    per_op_kind=False, needed_by=lambda op_class: bool(op_class.STATE_ACCESS),
    need="it owns state")
