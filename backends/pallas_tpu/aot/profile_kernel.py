"""The compiled kernel's own core work: libtpu's static schedule, scaled per layer.

libtpu charges a loop its full trip count, so profiling a 64-layer kernel costs
what compiling 64 unrolled layers would. Instead ``profile`` builds the same
model cut to two depths that differ by one repetition of its last stack (both
keep every earlier stack whole), plans each with the compiled plan's request and
geometry (so tiles, ring and collectives are the same per layer), AOT-compiles
both for TPU with libtpu's profile flags in a child process, and reads each
kernel's critical path split by unit. One repetition's work is their difference;
the full kernel is the deeper cut plus the missing repetitions times that
difference. Each unit is scaled the same way.

After ``profile``: a ``CoreWork`` with critical-path cycles by unit for the full
depth, at the calibrated clock (``compiler/calibration.json``), and the headroom
(HBM floor / core work). The profile charges every DMA the full HBM rate and has
no contention: it measures core work, never a step time (docs/floors.md).
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from megakernel.backends.pallas_tpu.aot import static_profile

WORKER = "megakernel.backends.pallas_tpu.aot.profile_kernel"
UNITS = ("mxu_push", "mxu_stream", "vector", "cross_lane", "scalar", "stall", "dma_issue")


@dataclass(frozen=True)
class CoreWork:
    layers: int                 # of the full model
    cuts: tuple[int, int]       # depths profiled
    cycles: dict                # unit -> critical-path cycles, full depth
    clock_hz: float
    hbm_floor_ms: float

    @property
    def total_cycles(self) -> float:
        return sum(self.cycles.values())

    @property
    def ms(self) -> float:
        return self.total_cycles / self.clock_hz * 1e3

    @property
    def headroom(self) -> float:
        """HBM floor / core work: above 1, the core keeps up with HBM."""
        return self.hbm_floor_ms / self.ms

    def summary(self) -> str:
        parts = ", ".join(f"{u} {self.cycles.get(u, 0) / self.clock_hz * 1e3:.3f}"
                          for u in UNITS)
        return (f"core work (libtpu static schedule, critical path at "
                f"{self.clock_hz / 1e9:.3f} GHz): {self.ms:.3f} ms per step [{parts} ms]; "
                f"HBM floor {self.hbm_floor_ms:.3f} ms, headroom {self.headroom:.2f}x "
                f"(profiled at {self.cuts[0]} and {self.cuts[1]} layers, scaled to "
                f"{self.layers})")


def cut_depths(model) -> tuple[int, int, int]:
    """(shallow, deep, repetitions missing from deep): the deep cut ends one
    repetition of the last stack after the shallow one, and the shallow one has
    two where the stack has three: the first repetition after the shortest cut
    fills slack on the critical path (llama-3.2-1b: 1 -> 2 layers adds 7,379
    cycles, 2 -> 3 adds 146,825 and 3 -> 4 adds 146,307; docs/floors.md)."""
    last = model.stacks[-1]
    reps = min(last.count, 3)
    deep = last.start + reps * last.period
    return deep - last.period, deep, last.count - reps


def profile(plan, *, topology: str, timeout: float = 900.0) -> CoreWork:
    """Core work of the kernel of ``plan`` (built from the plan itself, cut to two
    depths) compiled for ``topology``."""
    shallow, deep, missing = cut_depths(plan.model)
    with tempfile.TemporaryDirectory(prefix="megakernel-profile-") as work:
        plan_file, dump = Path(work) / "plan.json", Path(work) / "dump"
        plan_file.write_text(plan.to_json())
        dump.mkdir()
        # One child per depth, each with its own libtpu: a failure names its depth.
        got = {}
        for depth in (shallow, deep):
            got.update(static_profile.run_child(WORKER, [str(plan_file), topology, str(depth),
                                                         str(dump)], str(dump), timeout / 2))
    return scale(got[str(shallow)], got[str(deep)], missing, plan, (shallow, deep))


def scale(a: dict, b: dict, missing: int, plan, cuts) -> CoreWork:
    """Full depth from the shallow (``a``) and deep (``b``) cut's units: the deep
    cut plus ``missing`` repetitions of the difference of their totals. The
    critical path of a deeper kernel can route differently (a wait hidden behind
    the extra layer's compute), so single units may shrink; the repetition's
    total is split over the units that grew, in proportion to their growth."""
    from megakernel.compiler import calibration
    from megakernel.compiler.floors import floors

    per_rep = sum(b.values()) - sum(a.values())
    grew = {u: max(b.get(u, 0) - a.get(u, 0), 0) for u in UNITS}
    norm = sum(grew.values()) or 1
    cycles = {u: b.get(u, 0) + missing * per_rep * grew[u] / norm for u in UNITS}
    return CoreWork(len(plan.model.layers), tuple(cuts), cycles,
                    calibration.load().rate("clock_hz"), floors(plan).hbm_ms)


def _cut_plan(model, plan, layers: int):
    from megakernel.compiler.pipeline import plan_model

    r, g = plan.request, plan.memory.geometry
    fixed = {k: v for k, v in dataclasses.asdict(g).items() if v}
    overrides = {k: v for k, v in dataclasses.asdict(r.overrides).items() if v is not None}
    overrides.update(fixed)
    if plan.memory.experts:      # the full plan's expert parallelism, not the cut's choice
        overrides.setdefault("moe_parallel", plan.shard.ep if plan.shard.ep > 1 else "tp")
    cut = model.truncated(layers)
    return cut, plan_model(cut, target=plan.target, devices=plan.shard.cores, batch=r.batch, tokens=r.tokens,
                           context=r.context, steps=r.steps, overrides=overrides)


def main(argv: list[str]) -> int:
    """Child: profile the plan's model cut to each given depth."""
    from megakernel.backends.pallas_tpu.aot.tpu_compile import aot_compile
    from megakernel.backends.pallas_tpu.codegen.load import compile_model
    from megakernel.compiler.plan import Plan

    plan_file, topology, *depths, dump = argv
    full = Plan.from_json(Path(plan_file).read_text())
    out = {}
    for depth in depths:
        for f in Path(dump).iterdir():
            f.unlink() if f.is_file() else shutil.rmtree(f)
        model, plan = _cut_plan(full.model, full, int(depth))
        with tempfile.TemporaryDirectory(prefix="megakernel-cut-") as kdir:
            # The kernel alone: the cache write-back XLA runs after it is not
            # core work, and beside a kernel that claims the whole VMEM the
            # profile pass ran out of it (tiny-moe/1: 69.33 of 63.94 MiB).
            from megakernel.backends.pallas_tpu.codegen import load

            module = load.import_module(compile_model(model, plan, kdir))
            # libtpu's profile pass aborts ("No DMA issue node found for sync
            # flag") on the window and Gated DeltaNet state DMAs started a
            # layer ahead (qwen3.5-27b/8 cut to 8 layers); the op's own
            # order is the same core work, its waits merely not hidden.
            module.APPENDED_SYNC = True
            # It aborts on every multi-core kernel too, on the waits for peers'
            # DMAs: each collective's links become local DMAs of the same bytes
            # (collectives.py), the core work of the kernel's own side.
            module.LOCAL_COLLECTIVES = True
            # And on the ring's waits where the semaphore is computed from the
            # layer index in some layer loops: each tile signals the semaphore
            # of its place in the layer (its bank still computed). On a kernel
            # that profiles both ways (qwen3-8b/4 cut to 2 layers, MLP 4,096,
            # 8 banks) every unit but two is within 1%: MXU streaming +8%, and
            # stalls 13,353 against 37,818 cycles, the profile no longer
            # serialising those DMAs (docs/floors.md).
            module.STATIC_RING_SEMAPHORES = True
            # And every MoE layer's expert loop at the cost model's count of
            # items (ExpertStream.max_distinct x chunks): libtpu's schedule
            # counts a loop over the routed experts, a computed trip count, once.
            module.PROFILE_EXPERT_ITEMS = True
            aot_compile(module, plan, topology=topology, write_back=False)
        out[depth] = static_profile.read(dump, "").breakdown
        print(f"{depth} layers: {out[depth]}", file=sys.stderr, flush=True)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
