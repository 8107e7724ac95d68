"""The XLA baseline of a plan, measured two ways: modeled, and by libtpu's static schedule.

The baseline is the decode step a user would pick instead of the megakernel: the
plain-JAX reference as XLA ops, jitted and sharded over the plan's cores
(bench/xla_step.py), compiled ahead of time by libtpu for the megakernel's
topology from shapes only. After

- ``modeled(plan, topology=)``: an ``XlaCost`` (bench/xla_cost.py) of the step as
  a user runs it (caches donated, new rows written in place), from its compiled
  program, op by op at the cost model's constants: every figure modeled;
- ``core_work(plan, topology=)``: an ``XlaCoreWork``: libtpu's static schedule of
  the same step, every op's estimate summed (the ops run one after another), in
  a child process with libtpu's profile flags. libtpu estimates no async copy,
  so the prefetches XLA's memory-space assignment runs beside the ops are not
  in it: a lower bound of the program by libtpu's account, given with their
  bytes and, as if none overlapped an op, at the profile's DMA rate;

each at the model's full depth, from two cut depths (``cut_depths``): the program
is unrolled, so each figure is a sum over ops and the full model is the deeper
cut plus the missing layers times their difference. The ratio to the
megakernel's own figure (its modeled step; its core work, profile_kernel.py) is
the megakernel's advantage by the compiler's own account (bench/record.py).
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from megakernel.backends.pallas_tpu.aot import static_profile

WORKER = "bench.xla_baseline"
# The profiled compile prefetches no weight across programs (one 24 MiB copy
# on qwen3-8b/4, started where the previous step ends): with it libtpu's
# profile pass ran out of VMEM (62 MiB of "HLO temp" plus an op's 24 MiB of
# scoped VMEM, qwen3-8b/4 cut to 3 layers). Turning memory-space assignment
# off instead (--xla_gf_vmem_memory_space_assignment=false, every op then
# reading its own operands) made the pass abort on 8 of the 17 bench models
# ("No DMA issue node found for sync flag"), this on 2 (mixtral-8x7b, whose
# batched expert matmul it cannot model, and the 32-core all-reduces).
PROFILE_FLAGS = "--xla_msa_max_cross_program_prefetches=0"


@dataclass(frozen=True)
class XlaCoreWork:
    cycles: float               # the ops' estimates, full depth
    ops: float                  # ops libtpu profiled, full depth
    async_bytes: float          # moved by the async copies beside them, full depth
    cuts: tuple[int, int]
    clock_hz: float
    dma_bytes_per_cycle: float  # the profile's own HBM rate (compiler/calibration.json)

    @property
    def ms(self) -> float:
        return self.cycles / self.clock_hz * 1e3

    @property
    def serial_ms(self) -> float:
        """With every async copy at the profile's DMA rate, none overlapped."""
        return (self.cycles + self.async_bytes / self.dma_bytes_per_cycle) / self.clock_hz * 1e3


def modeled_fields(cost) -> dict:
    """An ``XlaCost`` as bench.json fields, each named modeled (seconds as ms)."""
    return {f"xla_modeled_{k.removesuffix('_s')}{'_ms' if k.endswith('_s') else ''}":
            v * 1e3 if k.endswith("_s") else v for k, v in vars(cost).items()}


def cut_depths(model) -> tuple[int, int, int]:
    """(shallow, deep, repetitions missing from deep): one and two repetitions of
    the last stack after every earlier stack whole; the whole model (no
    scaling) when its last stack repeats fewer than three times. XLA's ops run
    one after another, so a repetition's ops cost the same wherever it sits
    (the kernel's cuts, profile_kernel.cut_depths, keep one more for its
    overlapped critical path)."""
    last = model.stacks[-1]
    if last.count < 3:
        return len(model.layers), len(model.layers), 0
    shallow = last.start + last.period
    return shallow, shallow + last.period, last.count - 2


def _mesh(plan, topology: str):
    from megakernel.backends.pallas_tpu.aot.tpu_compile import topology_mesh

    from bench.xla_step import split_mesh

    return split_mesh(topology_mesh(topology, plan.shard.cores).devices.reshape(-1))


def compiled(plan, depth: int, topology: str, *, profiled: bool = False):
    """The XLA step of the plan's model cut to ``depth`` layers, compiled
    (``profiled``: the variant libtpu's profile pass reads, bench/xla_step.py)."""
    from bench.xla_step import build

    return build(plan.model.truncated(depth), plan, _mesh(plan, topology),
                 profiled=profiled).compile()


def modeled(plan, *, topology: str):
    """The modeled XLA step at full depth (an ``XlaCost``)."""
    from bench.xla_cost import model
    from bench.xla_hlo import parse

    shallow, deep, missing = cut_depths(plan.model)
    costs = {d: model(parse(compiled(plan, d, topology).as_text()), plan.target)
             for d in sorted({shallow, deep})}
    return costs[deep].extrapolate(costs[shallow], missing)


def core_work(plan, *, topology: str, timeout: float = 600.0) -> XlaCoreWork:
    """libtpu's static schedule of the XLA step at full depth, both cuts
    profiled in one child process (its libtpu loaded with the profile flags)."""
    from megakernel.compiler import calibration

    shallow, deep, missing = cut_depths(plan.model)
    depths = sorted({shallow, deep})
    with tempfile.TemporaryDirectory(prefix="megakernel-xla-profile-") as work:
        plan_file, dump = Path(work) / "plan.json", Path(work) / "dump"
        plan_file.write_text(plan.to_json())
        dump.mkdir()
        got = static_profile.run_child(WORKER, [str(plan_file), topology, str(dump),
                                                *map(str, depths)], str(dump), timeout,
                                       extra_flags=PROFILE_FLAGS, critical_path=False,
                                       cwd=Path(__file__).parent.parent)
    a, b = got[str(shallow)], got[str(deep)]
    full = [y + missing * (y - x) for x, y in zip(a, b)]
    cal = calibration.load()
    return XlaCoreWork(*full, (shallow, deep), cal.rate("clock_hz"),
                       cal.rate("dma_bytes_per_cycle"))


def main(argv: list[str]) -> int:
    """Child: compile the profiled variant of the plan's XLA step (no cache
    written, static expert slices: bench/xla_step.py) cut to each given depth,
    and sum libtpu's estimates of its ops."""
    import megakernel.kinds  # noqa: F401 - every op kind's rules
    from megakernel.compiler.plan import Plan

    from bench.xla_cost import async_bytes
    from bench.xla_hlo import parse

    plan_file, topology, dump, *depths = argv
    plan = Plan.from_json(Path(plan_file).read_text())
    out = {}
    for depth in depths:
        for f in Path(dump).iterdir():
            f.unlink() if f.is_file() else shutil.rmtree(f)
        text = compiled(plan, int(depth), topology, profiled=True).as_text()
        out[depth] = (*static_profile.program_cycles(dump), async_bytes(parse(text)))
        print(f"{depth} layers: {out[depth]}", file=sys.stderr, flush=True)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
