"""Choose the greedy decode steps per kernel call (``--steps-per-call auto``).

After ``choose(plan_at, model)``: the returned plan runs the smallest N whose
amortised per-call costs fall under ``AMORTISED_SHARE`` of the step, and its
``choices`` say which N and why. All times are the cost model's (modeled).

The rule, from a plan of the same request (N = 1 for ``choose``):

    per-call  P = launch (kernel launch + first DMA latency, cost.py)
                + XLA's copies around the call, as the cost model charges
                  them once per call (``CostReport.copy_bytes`` and
                  ``copy_ms``, compiler/xla_copies.py: the one-element
                  step scalars, and on 2+ cores next_token; the state is
                  read only and not copied), each copied byte read and
                  written at the DMA bandwidth
                + the commit of whole-access state after the call
                  (``CostReport.commit_ms``: each layer's state read and
                  written once per call)
    per-step  S = the modeled call without its launch, copies and commit, over its steps
    N         = ceil(P / (AMORTISED_SHARE x S)), at least 1, at most
                MAX_STEPS_PER_CALL and the room ``max_seq_len`` leaves

N is 1 when the request has several tokens per step or a state-owning kind
does not carry its state across steps (``STEPPING``). VMEM caps it too: the
plan at N declares the step buffers; if it does not fit, the choice is N = 1.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass

from megakernel.compiler.plan import Plan
from megakernel.compiler.request import MAX_STEPS_PER_CALL
from megakernel.errors import PlanningError

AUTO = "auto"
# Per-call costs may take at most this share of a step once amortised over the
# call's N steps (a design choice, not a measurement).
AMORTISED_SHARE = 0.05


@dataclass(frozen=True)
class StepsChoice:
    steps: int
    launch_s: float          # modeled, per call
    copy_bytes: int          # per core per call (CostReport.copy_bytes)
    copy_s: float            # modeled, per call (CostReport.copy_ms)
    step_s: float            # modeled step without the launch and copies
    cap: int                 # the most steps the request allows
    commit_s: float = 0.0    # modeled, per call (CostReport.commit_ms)
    why_one: str = ""        # why N is 1 whatever the costs

    def describe(self) -> str:
        if self.why_one:
            return f"{self.steps} ({self.why_one})"
        size = (f"{self.copy_bytes / 2**20:.2f} MiB" if self.copy_bytes >= 2**20
                 else f"{self.copy_bytes:,} B")
        copies = (f" + XLA copies {size} per core {self.copy_s * 1e6:.1f} us"
                  if self.copy_bytes else "")
        if self.commit_s:
            copies += f" + state commit {self.commit_s * 1e6:.1f} us"
        capped = f", capped at {self.cap}" if self.steps == self.cap else ""
        return (f"{self.steps} (smallest N with per-call costs / N <= "
                f"{AMORTISED_SHARE:.0%} of the step: launch {self.launch_s * 1e6:.1f} us"
                f"{copies} over a {self.step_s * 1e6:.1f} us step, modeled{capped})")


def recommend(plan: Plan, *, context: int | None = None) -> StepsChoice:
    """The rule applied to ``plan``'s modeled costs; ``context``, when the user
    fixed it, caps N by the room left after it."""
    from megakernel.compiler.stepping import STEPPING

    model, req, c = plan.model, plan.request, plan.cost
    launch, copy, moved = c.launch_ms / 1e3, c.copy_ms / 1e3, c.copy_bytes
    commit = c.commit_ms / 1e3
    step = (c.call_ms - c.launch_ms - c.copy_ms - c.commit_ms) / 1e3 / req.steps
    cap = min(MAX_STEPS_PER_CALL, model.max_seq_len - req.tokens - (context or 0) + 1)
    base = dict(launch_s=launch, copy_bytes=moved, copy_s=copy, step_s=step, cap=max(cap, 1),
                commit_s=commit)
    why = ""
    if req.tokens != 1:
        why = f"tokens={req.tokens} per step: several steps per call need one"
    for st in model.stacks:
        for node in st.layer.nodes:
            if not why and node.op.state(1, model.max_seq_len, model.dtype):
                rule = STEPPING(node.op.kind, f"{st.layer.kind}.{node.name}")
                if not rule.carries:
                    why = f"op kind {node.op.kind!r} does not carry its state across steps"
    if why or cap <= 1:
        return StepsChoice(1, **base, why_one=why or "no room after the context")
    n = math.ceil((launch + copy + commit) / (AMORTISED_SHARE * step)) if step > 0 else cap
    return StepsChoice(min(max(n, 1), cap), **base)


def choose(plan_at: Callable[[int], Plan], *, context: int | None = None) -> Plan:
    """The plan at the chosen N (``plan_at(n)`` plans the request with n steps),
    its choice recorded in ``choices``."""
    one = plan_at(1)
    pick = recommend(one, context=context)
    plan, note = one, pick.describe()
    if pick.steps > 1:
        try:
            plan = plan_at(pick.steps)
        except PlanningError as err:
            if not err.path.startswith("plan.vmem"):
                raise
            note = f"1 (the rule's {pick.steps} does not fit VMEM: {err.message})"
    return dataclasses.replace(plan, choices=plan.choices + (("steps_per_call", f"auto: {note}"),))
