"""The tiny models' interpret-mode stages after the check: the bytes one traced
step of the kernel moved, and the step replayed from the traces of the
megakernel and of its synchronised-ops variant (``bench/replay.py``; modeled).
"""

from __future__ import annotations

from pathlib import Path

from bench.config import REPLAY_CHART, RESULTS


def trace_bytes(plan, res) -> dict:
    """Bytes one traced step of the kernel moved on core 0 (trace mode, interpreter):
    HBM reads (the column), HBM writes, by kind, and the weights against the plan's."""
    from megakernel.backends.pallas_tpu.check import trace_dmas as trace

    mine = [e for e in res.events if e.src_dev == 0 and e.dst_dev == 0]
    kinds: dict[str, int] = {}
    for e in mine:
        key = f"{e.kind} {e.src}->{e.dst}"
        kinds[key] = kinds.get(key, 0) + e.nbytes
    plan_weights = trace.plan_weight_bytes(plan)
    return {"trace_bytes_per_step": sum(e.nbytes for e in mine if e.src == "hbm"),
            "trace_hbm_write_bytes_per_step": sum(e.nbytes for e in mine if e.dst == "hbm"),
            "trace_remote_bytes_per_step": sum(e.nbytes for e in res.events
                                               if e.src_dev == 0 and e.dst_dev != 0),
            "trace_bytes_by_kind": kinds,
            "trace_weight_bytes_per_step": res.hbm_weight_bytes(0),
            "plan_weight_bytes_per_step": sum(plan_weights.values()),
            "trace_dma_count": len(mine)}


def trace_replay(model, plan, weights, kdir, traced) -> dict:
    """The step replayed from the megakernel's trace (``traced``) and from the
    trace of its synchronised-ops variant (``bench/replay.py``; modeled), with
    both timelines drawn for the chart model."""
    from megakernel.backends.pallas_tpu.codegen.load import compile_model
    from megakernel.backends.pallas_tpu.codegen import load
    from megakernel.backends.pallas_tpu.check import trace_dmas as trace

    from bench.replay import plan_compute, replay
    from bench.timeline import Expanded, plot

    def sync_trace():
        path = compile_model(model, plan, Path(kdir) / "sync", synchronised=True)
        return trace.trace_step(model, plan, weights, module=load.import_module(path))

    out = {}
    for sync, res in ((False, traced), (True, sync_trace())):
        rep = replay(res.program(0), plan.target, rows_padded=plan.memory.rows_padded,
                     itemsize=model.dtype.itemsize, f32=model.dtype.value == "float32",
                     compute=plan_compute(plan))
        key = "replay_sync" if sync else "replay"
        stalls = {}
        for e in rep.events:
            if e.lane == "stall":
                kind = e.label.removeprefix("wait ")
                stalls[kind] = stalls.get(kind, 0.0) + (e.end_us - e.start_us) / 1e3
        out.update({f"{key}_step_ms": rep.step_ms, f"{key}_stall_ms": rep.stall_us / 1e3,
                    f"{key}_stall_ms_by_kind": stalls, f"{key}_hbm_bytes": rep.bytes})
        if model.name == REPLAY_CHART:
            RESULTS.mkdir(parents=True, exist_ok=True)
            png = RESULTS / f"replay_{model.name}{'_sync' if sync else ''}.png"
            what = "synchronised-ops variant" if sync else "megakernel"
            plot(Expanded(rep.events, (), rep.step_us), png,
                 title=f"{model.name}, 1 core, batch 1: one step of the {what} replayed from "
                       f"its trace (MODELED, {rep.step_us:.1f} us)",
                 xlabel="time in step, us (MODELED: the traced DMA order at the cost model's "
                        "rates, bench/replay.py)")
            out[f"{key}_png"] = str(png)
    out["replay_sync_slowdown"] = out["replay_sync_step_ms"] / out["replay_step_ms"]
    # the replay against the cost model (both modeled, one DMA model, the same compute)
    out["replay_over_modeled"] = out["replay_step_ms"] / plan.cost.step_ms
    return out
