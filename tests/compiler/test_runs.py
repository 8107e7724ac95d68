"""A periodic stack whose body repeats layers (qwen3.5: 3 Gated DeltaNet
layers, then attention, x 16) is planned run by run: each run's layer once,
indexed by its run-layer index over count x layers; the step's collectives
and ring tiles keep their order of execution."""

from megakernel.compiler.pipeline import plan_model
from megakernel.models import zoo


def _plan():
    return plan_model(zoo.model("qwen3.5-27b"), devices=8, batch=1, tokens=1)


def test_all_reduces_alternate_their_slots_in_execution_order():
    plan = _plan()
    ss = plan.shard.stacks[0]
    assert ss.runs == ((0, 3), (3, 1))
    sites = [s for s in plan.collectives.sites if s.stack == 0]
    order = []                     # sequence numbers as the kernel runs them
    for rep in range(ss.count):
        for first, c in ss.runs:
            for i in range(c):
                order += [s.seq(rep * c + i) for s in sites
                          if s.producer.startswith(f"l{first}_")]
    assert order == list(range(order[0], order[0] + len(order)))
    assert sum(s.per_step for s in sites) == len(order) == 64 * 2


def test_the_stream_runs_every_layer_in_order_once():
    plan = _plan()
    stream = plan.memory.stream
    entries = list(stream.expand())
    assert [e.index for e in entries] == list(range(stream.total))
    layers = [e.layer for e in entries if e.layer is not None]
    assert layers == sorted(layers) and set(layers) == set(range(64))
    st = stream.stacks[0]
    # the 3 Gated DeltaNet layers' run, then the attention layer's (tile counts
    # follow the chosen bank size)
    (t0, n0, c0), (t1, n1, c1) = st.runs
    assert (t0, c0, t1, c1) == (0, 3, n0, 1) and st.per_layer == 3 * n0 + n1
    # each weight of each layer streamed exactly once
    names = [e.param for e in entries if e.layer is not None]
    assert len(names) == len(set((e.param, e.tile.row0, e.tile.col0) for e in entries
                                 if e.layer is not None))
    assert {n.split(".")[1] for n in names} == {str(i) for i in range(64)}


def test_run_operands_hold_every_layer_of_the_run():
    plan = _plan()
    shapes = {b.name: b.shape for b in plan.memory.buffers}
    assert shapes["hbm.s0.l0_q_proj.weight"][0] == 48      # 3 GDN layers x 16
    assert shapes["hbm.s0.l3_q_proj.weight"][0] == 16
    assert shapes["hbm.s0.l0_gdn.recurrent"][0] == 48
    assert shapes["hbm.s0.l3_attention.k"][0] == 16
    # one set of the GDN library's buffers, not three
    assert not [n for n in shapes if n.startswith(("l1_", "l2_"))]
