"""Op buffers shared across a periodic body (compiler/plan_buffers.py): an
op's own buffers, live at its program point only, are one allocation for
every body position that runs the op at that shape; buffers that carry data
across the stack's loop (attention tiles fetched a repetition ahead) are not."""

from megakernel.compiler.buffers import Kind
from megakernel.compiler.pipeline import plan_model
from megakernel.models import zoo


def _bound(plan, node):
    return plan.memory.bound(0, node)


def test_the_moe_layers_of_a_body_share_one_set_of_expert_slots():
    plan = plan_model(zoo.model("gpt-oss-20b"), devices=8, batch=1, tokens=1)
    assert plan.model.stacks[0].period == 2
    sliding, full = _bound(plan, "l0_moe"), _bound(plan, "l1_moe")
    assert sliding and sliding == full
    assert "moe.gate_slots" in sliding.values()          # the layer-local name
    slots = {b.name for b in plan.memory.buffers if b.kind == Kind.EXPERT_SLOTS}
    assert slots and slots <= set(sliding.values())      # one set in the whole plan


def test_attention_buffers_stay_per_position():
    plan = plan_model(zoo.model("gpt-oss-20b"), devices=8, batch=1, tokens=1)
    sliding, full = _bound(plan, "l0_attention"), _bound(plan, "l1_attention")
    assert set(sliding.values()).isdisjoint(full.values())
    stack = [p.index for p in plan.memory.points if p.stack == 0]
    for name in (*sliding.values(), *full.values()):
        b = plan.memory.buffer(name)       # fetched a repetition ahead: the whole stack
        assert (b.first, b.last) == (stack[0], stack[-1]), name


def test_no_buffer_is_bound_twice_while_live_across_the_loop():
    """A buffer two nodes of one body share is live at their points only."""
    for name, cores in (("gpt-oss-20b", 8), ("qwen3-next-80b-a3b", 8), ("qwen3.5-27b", 8)):
        plan = plan_model(zoo.model(name), devices=cores, batch=1, tokens=1)
        users: dict[str, set] = {}
        for b in plan.memory.bindings:
            if b.stack == 0 and not b.node.startswith("<"):
                users.setdefault(b.buffer, set()).add(b.node)
        assert any(len(nodes) > 1 for nodes in users.values()) or name == "qwen3.5-27b"
        for buf, nodes in users.items():
            if len(nodes) > 1:
                assert plan.memory.buffer(buf).kind not in (Kind.KV_TILES, Kind.STATE), (
                    name, buf, nodes)
