"""Reading libtpu's static schedule: the critical-path split and the per-layer scaling."""

import pytest

from megakernel.backends.pallas_tpu.aot import profile_kernel
from megakernel.backends.pallas_tpu.aot import static_profile
from megakernel.compiler.pipeline import plan_model
from megakernel.models import zoo

# A hand-written critical path in libtpu's dump format (cycles to the end).
PATH = """\
Length to end: 100, %0 = vsyncpa [#allocation6], 0
Length to end: 99, %1 = dma.hbm_to_vmem [thread:$0]  /*hbm=*/%s3_s0, /*size_in_granules=*/128
  window_bounds: 1
Length to end: 60, %2 = dma.done.wait [#allocation4], 128
Length to end: 58, %3 = vmatprep.subr.bf16.mxu0 %v0_v0
Length to end: 50, %4 = vmatpush1.bf16.msra.mxu0 %v2_v2
Length to end: 40, %5 = vmatmul.mubr.bf16.mxu0 %v3
Length to end: 30, %v6 = vmax.xlane.f32 %v4
Length to end: 20, %v7 = vadd.f32 %v5, %v6
Length to end: 10, %s8 = scalar_lea.vmem %s1, 8
"""


def test_breakdown_charges_each_gap_to_the_instruction_before_it():
    units, length = static_profile.breakdown(PATH)
    assert length == 100
    assert units == {"dma_issue": 2,            # the sync flag, the DMA's issue cycle
                     "stall": 38 + 2,           # the transfer waited out, the wait itself
                     "mxu_push": 8 + 10, "mxu_stream": 10, "cross_lane": 10,
                     "vector": 10, "scalar": 10}
    assert sum(units.values()) == length


def test_scaling_adds_the_missing_repetitions_of_the_difference():
    plan = plan_model(zoo.model("tiny-dense"), devices=1)
    a = {"mxu_push": 100, "stall": 500, "scalar": 50}
    b = {"mxu_push": 160, "stall": 480, "scalar": 70}     # the wait hid behind layer 2
    work = profile_kernel.scale(a, b, 10, plan, (1, 2))
    assert work.total_cycles == pytest.approx(710 + 10 * 60)
    assert work.cycles["stall"] == 480                     # a unit that shrank adds nothing
    assert work.cycles["mxu_push"] == pytest.approx(160 + 10 * 60 * 60 / 80)
    assert work.headroom == pytest.approx(work.hbm_floor_ms / work.ms)


def test_cut_depths_keep_earlier_stacks_whole():
    ds = zoo.model("deepseek-v3")          # 3 dense layers, then 58 MoE layers
    shallow, deep, missing = profile_kernel.cut_depths(ds)
    assert (shallow, deep, missing) == (5, 6, 55)
    assert deep + missing == len(ds.layers)


@pytest.mark.slow
def test_profile_of_a_real_kernel():
    """tiny-moe on two cores, compiled by libtpu with its profile (about 20 s):
    its collectives built as local DMAs (``LOCAL_COLLECTIVES``), since the
    profile pass aborts on waits for a peer's DMAs."""
    plan = plan_model(zoo.model("tiny-moe"), devices=2)
    assert plan.collectives.sites
    work = profile_kernel.profile(plan, topology="tpu7x:2x2x1", timeout=300)
    assert work.cycles["mxu_push"] > 0 and work.cycles["stall"] > 0
    assert all(v >= 0 for v in work.cycles.values())
    assert "headroom" in work.summary()


@pytest.mark.slow
def test_profile_of_a_kernel_whose_banks_are_computed():
    """qwen3-8b on 4 cores cut to 2 layers (vocabulary 4,096) at 10 banks of
    4 MiB: 26 tiles a layer, so each layer's banks are computed from its
    index. libtpu's profile pass aborted on it ("No DMA issue node found for
    sync flag") until the profile build gave each ring tile the semaphore of
    its place in the layer (``STATIC_RING_SEMAPHORES``); about 30 s."""
    import dataclasses

    from megakernel.ir.config import build

    card = dataclasses.replace(zoo.card("qwen3-8b"), num_layers=2, vocab_size=4096)
    plan = plan_model(build(card), devices=4, batch=1, tokens=1,
                      overrides={"bank_bytes": 4 << 20, "num_banks": 10})
    assert not plan.memory.stream.static_banks()
    work = profile_kernel.profile(plan, topology="tpu7x:2x2x1", timeout=600)
    assert work.cycles["mxu_push"] > 0 and work.cycles["scalar"] > 0


@pytest.mark.slow
def test_profile_counts_the_plans_expert_items():
    """qwen3-30b-a3b on 8 cores cut to 2 layers (vocabulary 4,096; about 10 s).
    Its expert loop runs over the routed experts, a computed trip count that
    libtpu's schedule counts once: 2,462 push cycles for both layers, less
    than one expert item's weights. The profile build runs the cost model's
    count (``PROFILE_EXPERT_ITEMS``: ExpertStream.max_distinct x chunks), so
    the pushes cover every item's weights at 2,048 a cycle (the MXU's bf16
    weight-load rate, docs/floors.md): 7,436 cycles against 6,144."""
    import dataclasses

    from megakernel.ir.config import build

    card = dataclasses.replace(zoo.card("qwen3-30b-a3b"), num_layers=2, vocab_size=4096)
    plan = plan_model(build(card), devices=8, batch=1, tokens=1)
    (e,) = plan.memory.experts
    item_weights = 3 * e.hidden * e.chunk
    want = card.num_layers * e.max_distinct * e.chunks * item_weights / 2048
    work = profile_kernel.profile(plan, topology="tpu7x:2x2x1", timeout=600)
    assert work.cycles["mxu_push"] >= want, (work.cycles, want)
