"""The geometry search keeps the memory plans of its last few evaluations, not
one per geometry tried: each holds every stack's buffers, and keeping them all
took 1.4 GB for a 1,024-layer irregular sliding/full model (issue 33)."""

import gc

from megakernel.compiler import choose_geometry as cg
from megakernel.compiler.pipeline import plan_model
from megakernel.compiler.plan_memory import MemoryPlan
from megakernel.models import zoo


def test_the_search_keeps_a_bounded_number_of_memory_plans(monkeypatch):
    searches = []
    real = cg._Search

    def spy(*args, **kwargs):
        searches.append(real(*args, **kwargs))
        return searches[-1]

    monkeypatch.setattr(cg, "_Search", spy)
    plan = plan_model(zoo.model("tiny-dense"), devices=1, batch=1, tokens=1)
    gc.collect()
    tried = sum(len(s.seen) for s in searches)
    held = {id(o) for s in searches for o in gc.get_referents(*s.seen.values(), *vars(s).values())
            if isinstance(o, MemoryPlan)}
    held |= {id(m) for s in searches for m in s.plans.values()}
    assert tried > 2 * cg.KEPT_PLANS
    assert len(held) <= cg.KEPT_PLANS * len(searches), (len(held), tried)
    assert plan.memory.vmem_total <= plan.target.vmem_budget
