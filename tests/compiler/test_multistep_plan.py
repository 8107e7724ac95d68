"""Plans of several decode steps per call (steps_per_call N): the request's
rules, the step buffers, the declared VMEM, and the per-call/per-step costs."""

import pytest

from megakernel.compiler.stepping import STEPPING, Stepping
from megakernel.compiler.pipeline import plan_model
from megakernel.errors import PlanningError
from megakernel.models import zoo


@pytest.fixture(scope="module")
def plans():
    model = zoo.model("tiny-moe")
    return model, {n: plan_model(model, devices=2, batch=2, steps=n) for n in (1, 16)}


def test_launch_is_paid_once_per_call_and_steps_n_times(plans):
    _, p = plans
    one, many = p[1].cost, p[16].cost
    assert one.call_ms == pytest.approx(one.step_ms) and one.steps_per_call == 1
    assert many.steps_per_call == 16
    assert many.call_ms == pytest.approx(16 * many.step_ms)
    # the launch is amortised over the call; the launch also covers the first
    # step's embedding gather latency, which every later step waits on its own
    # (the gather needs the previous step's token), while the ring runs ahead
    latency_ms = p[1].target.constants.dma_latency_s * 1e3
    assert many.step_ms <= one.step_ms - (15 / 16) * (one.launch_ms - latency_ms) + 1e-9
    assert many.launch_ms == one.launch_ms > 0
    assert many.hbm_bytes_per_core == one.hbm_bytes_per_core     # per step, unchanged


def test_step_buffers_only_in_multistep_plans(plans):
    _, p = plans
    step = {b.name for b in p[16].memory.buffers if b.name.startswith("step.")}
    assert step == {"step.tokens", "step.start", "step.stopped", "step.argmax_v",
                    "step.argmax_s", "step.sems"}
    assert not any(b.name.startswith("step.") for b in p[1].memory.buffers)
    names = [o.buffer for o in p[16].memory.operands]
    assert names[:4] == ["tokens", "start_pos", "end_id", "limit"]


def test_multistep_kernel_declares_the_plan_byte_for_byte(plans, tmp_path):
    from megakernel.backends.pallas_tpu.codegen.load import compile_model
    from megakernel.backends.pallas_tpu.codegen import load
    from tests.backends.test_emit import declared_vmem

    model, p = plans
    module = load.import_module(compile_model(model, p[16], tmp_path))
    assert declared_vmem(module) == p[16].memory.vmem_declared == module.VMEM_DECLARED_BYTES
    assert module.STEPS_PER_CALL == 16
    src = (tmp_path / "kernel.py").read_text()
    assert src.count("def decode_step(i, carry):") == 1     # one loop, not N bodies


def test_plan_json_keeps_steps_per_call(plans):
    from megakernel.compiler.plan import Plan

    _, p = plans
    back = Plan.from_json(p[16].to_json())
    assert back.request.steps == 16 and back.digest() == p[16].digest()


@pytest.mark.parametrize("kw, path", [
    (dict(tokens=2, steps=4), "request.tokens"),
    (dict(steps=0), "request.steps_per_call"),
    (dict(steps=129), "request.steps_per_call"),
    (dict(steps=True), "request.steps_per_call"),
])
def test_bad_steps_per_call_is_named(kw, path):
    with pytest.raises(PlanningError) as err:
        plan_model(zoo.model("tiny-dense"), devices=1, **kw)
    assert err.value.path == path


def _rules():
    STEPPING.kinds()                      # every kind's rules loaded before one is changed
    return STEPPING._rules


def test_state_kinds_without_step_support_are_refused_by_name(monkeypatch):
    """A kind whose library says it does not carry its state across steps is
    refused for several steps per call, before planning, with its reason."""
    monkeypatch.setitem(_rules(), "mla", Stepping(False, "its cache write is unconditional"))
    with pytest.raises(PlanningError) as info:
        plan_model(zoo.model("deepseek-v3"), devices=32, steps=4)
    assert info.value.path == "request.steps_per_call"
    assert "'mla'" in str(info.value) and "--steps-per-call 1" in str(info.value)
    assert "its cache write is unconditional" in str(info.value)


def test_every_state_owning_kind_says_how_it_steps():
    """The multi-step rule is registered per state-owning kind (its kernel
    library's word), not kept as a list of names in the planner."""
    from megakernel.ir.types import DType
    from megakernel.ir.ops import OP_KINDS
    from tests.ir.test_hostile_fields import VALID_OPS

    owners = {k for k, kw in VALID_OPS.items()
              if OP_KINDS[k](**kw).state(1, 16, DType("float32"))}
    assert {"attention", "mla", "gated_deltanet"} <= owners
    assert owners <= STEPPING.kinds()
    assert all(STEPPING(k).how for k in owners)


def test_a_state_kind_with_no_multi_step_rule_is_a_named_error(monkeypatch):
    from megakernel.registry import MissingRuleError

    monkeypatch.delitem(_rules(), "attention")
    with pytest.raises(MissingRuleError) as info:
        plan_model(zoo.model("tiny-dense"), devices=1, steps=4)
    assert str(info.value).startswith("no multi-step rule for op kind 'attention' (")
    assert "kind_<name>.py" in str(info.value)
    plan_model(zoo.model("tiny-dense"), devices=1, steps=1)     # one step needs no rule


# Measured by `aot` (tests/backends/test_aot_multistep.py, libtpu 0.0.51):
# tiny-moe on 4 cores, batch 1, copies XLA adds around one call per core: the
# token id, the position and next_token [8, 128] int32 (was 1.51 MiB while the
# KV caches were aliased: XLA copied them in and out).
TINY_MOE_4_COPY_BYTES = 4 + 4 + 8 * 128 * 4


def test_auto_is_the_smallest_n_that_amortises_the_per_call_costs(plans):
    from megakernel.compiler import choose_steps
    from megakernel.compiler.xla_copies import copy_bytes

    model, p = plans
    auto = plan_model(model, devices=2, batch=2, steps="auto")
    pick = choose_steps.recommend(p[1])
    n = auto.request.steps
    assert n == pick.steps > 1
    per_call = pick.launch_s + pick.copy_s
    share = choose_steps.AMORTISED_SHARE * pick.step_s
    assert per_call / n <= share < per_call / (n - 1)
    c = p[1].cost
    assert pick.launch_s == pytest.approx(c.launch_ms / 1e3)
    # one copy model: the cost model's XLA copies (compiler/xla_copies.py), each
    # copied byte read and written once, charged once per call
    assert pick.copy_bytes == c.copy_bytes == copy_bytes(p[1].memory, p[1].shard.cores) > 0
    assert pick.copy_s == pytest.approx(c.copy_ms / 1e3) and pick.copy_s > 0
    assert pick.step_s == pytest.approx((c.call_ms - c.launch_ms - c.copy_ms) / 1e3)
    note = dict(auto.choices)["steps_per_call"]
    assert note.startswith(f"auto: {n} (smallest N") and "modeled" in note
    from megakernel.compiler import report
    assert f"steps_per_call: auto: {n}" in report.terminal(auto)
    assert f"auto would choose: {n} " in report.terminal(p[1])


def test_the_modeled_copies_are_the_measured_ones():
    from megakernel.compiler import choose_steps

    model = zoo.model("tiny-moe")
    one = plan_model(model, devices=1)      # no remote DMA: only the one-element scalars
    assert one.cost.copy_bytes == choose_steps.recommend(one).copy_bytes == 4 + 4
    four = plan_model(model, devices=4)     # the KV caches are read only: not copied
    assert four.cost.copy_bytes == choose_steps.recommend(four).copy_bytes \
        == TINY_MOE_4_COPY_BYTES


def test_auto_is_one_step_where_steps_cannot_run(monkeypatch):
    from megakernel.compiler import choose_steps

    plan = plan_model(zoo.model("tiny-dense"), devices=1, tokens=2, steps="auto")
    assert plan.request.steps == 1 and "tokens=2" in dict(plan.choices)["steps_per_call"]
    monkeypatch.setitem(_rules(), "attention", Stepping(False, "test"))
    plan = plan_model(zoo.model("tiny-dense"), devices=1, steps="auto")
    assert plan.request.steps == 1 and "'attention' does not carry" in dict(
        plan.choices)["steps_per_call"]
    monkeypatch.undo()
    # the rule's N whose step buffers do not fit VMEM falls back to one step
    one = plan_model(zoo.model("tiny-dense"), devices=1)

    def plan_at(n):
        if n > 1:
            raise PlanningError("too big", path="plan.vmem")
        return one
    got = choose_steps.choose(plan_at)
    assert got.request.steps == 1 and "does not fit VMEM" in dict(got.choices)["steps_per_call"]

