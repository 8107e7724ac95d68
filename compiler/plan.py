"""The plan: everything the code generator executes, frozen and exportable.

After ``pipeline.plan_model``: a ``Plan`` bundles the request, the target,
the shard plan, the memory plan (with the weight stream), the collective
schedule and the cost report. ``to_json()`` is deterministic, and ``digest()``
(SHA-256 of it) names the plan in generated code and caches.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
from dataclasses import dataclass

from megakernel.compiler.cost import CostReport
from megakernel.compiler.plan_memory import MemoryPlan
from megakernel.compiler.request import PlanRequest
from megakernel.compiler.schedule_collectives import CollectivePlan
from megakernel.compiler.shard import ShardPlan
from megakernel.compiler.target import COST_TABLE, Target

PLAN_FORMAT = "megakernel.plan/1"


@dataclass(frozen=True)
class Plan:
    model: str
    request: PlanRequest
    target: Target
    shard: ShardPlan
    memory: MemoryPlan
    collectives: CollectivePlan
    cost: CostReport
    choices: tuple[tuple[str, str], ...] = ()   # (decision, why), for the report

    def to_dict(self) -> dict:
        out = {"format": PLAN_FORMAT}
        out.update({f.name: _encode(getattr(self, f.name)) for f in dataclasses.fields(self)})
        out["cost_sources"] = {k: c.source for k, c in COST_TABLE.items()}
        return out

    def to_json(self, indent: int | None = None) -> str:
        return json.dumps(self.to_dict(), indent=indent, sort_keys=True)

    def digest(self) -> str:
        return hashlib.sha256(self.to_json().encode()).hexdigest()[:16]


def _encode(value):
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _encode(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, (tuple, list)):
        return [_encode(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _encode(v) for k, v in value.items()}
    if isinstance(value, float):
        return float(f"{value:.6g}")        # stable digits across platforms
    return value
