"""The plan: everything the code generator executes, frozen and exportable.

After ``pipeline.plan_model``: a ``Plan`` bundles the model, the request, the
target, the shard plan, the memory plan (with the weight stream), the
collective schedule and the cost report. ``to_json()`` is deterministic,
``digest()`` (SHA-256 of it) names the plan in generated code and caches, and
``from_json`` reads it back whole: a plan stands alone.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass

from megakernel.compiler.cost import CostReport
from megakernel.compiler.plan_memory import MemoryPlan
from megakernel.compiler.request import PlanRequest
from megakernel.compiler.schedule_collectives import CollectivePlan
from megakernel.compiler.shard import ShardPlan
from megakernel.compiler.plan_json import decode, encode
from megakernel.compiler.target import COST_TABLE, Target
from megakernel.errors import PlanningError
from megakernel.ir.graph import Model

PLAN_FORMAT = "megakernel.plan/1"


@dataclass(frozen=True)
class Plan:
    model: Model
    request: PlanRequest
    target: Target
    shard: ShardPlan
    memory: MemoryPlan
    collectives: CollectivePlan
    cost: CostReport
    choices: tuple[tuple[str, str], ...] = ()   # (decision, why), for the report

    def to_dict(self) -> dict:
        out = {"format": PLAN_FORMAT}
        out.update({f.name: encode(getattr(self, f.name)) for f in dataclasses.fields(self)})
        out["cost_sources"] = {k: c.source for k, c in COST_TABLE.items()}
        return out

    def to_json(self, indent: int | None = None) -> str:
        return json.dumps(self.to_dict(), indent=indent, sort_keys=True)

    def digest(self) -> str:
        return hashlib.sha256(self.to_json().encode()).hexdigest()[:16]

    @classmethod
    def from_dict(cls, data: dict) -> "Plan":
        """The plan ``to_dict`` wrote (a compiled folder's plan.json)."""
        if not isinstance(data, dict) or data.get("format") != PLAN_FORMAT:
            raise PlanningError(f"not a {PLAN_FORMAT} document", path="plan.format",
                                hint="give the plan.json that `megakernel compile` wrote")
        try:
            return decode(cls, {k: v for k, v in data.items()
                                if k not in ("format", "cost_sources")})
        except (KeyError, TypeError, ValueError) as err:
            if isinstance(err, PlanningError):
                raise
            raise PlanningError(f"plan.json does not hold a plan: {type(err).__name__}: "
                                f"{str(err)[:200]}", path="plan",
                                hint="recompile the folder with `megakernel compile`") from None

    @classmethod
    def from_json(cls, text: str) -> "Plan":
        return cls.from_dict(json.loads(text))
