"""``make bench``: plan, generate, compile and check every zoo model; one table.

    python -m bench.run [--budget SECONDS] [--models a,b] [--no-aot]

Per model (batch 1) it times, with ``time.perf_counter``, the planner, code
generation, the real TPU7x AOT compile (when libtpu is importable; shapes
only, so full-size models compile), an interpret-mode check (tiny models
only) and a trace-mode step (tiny models only: both run the kernel in the
Pallas interpreter on this CPU). Beside those it prints the cost model's step
time, HBM floor and efficiency (labelled modeled), the compiled VMEM against
the plan's, the bytes the traced kernel moved against the minimum, the
synchronised-ops ablation (``bench/timeline.py``), the AOT compile time of
qwen3-32b against the same model cut to 4 layers, and (tiny models) the step
replayed from the traces of the megakernel and of its synchronised-ops
variant (``bench/replay.py``: the ablation modeled from its own trace).

Each model runs in its own worker process (``--worker``) under a share of the
time budget, writing its record after every stage, so one slow or crashing
stage costs only its own cells. Any stage that fails or is missing prints its
error in its cell; no number is ever filled in for it.

Outputs: ``bench/results/bench.json``, ``bench/results/timeline.png`` and the
replay charts ``bench/results/replay_tiny-moe{,_sync}.png``.
"""

from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import argparse  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
from pathlib import Path  # noqa: E402

RESULTS = Path(__file__).parent / "results"
FORMAT = "megakernel.bench/1"

# (zoo name, TensorCores); all at batch 1. DeepSeek-V3 and Kimi-K2 (MLA) need
# 32 TensorCores (16 chips, tpu7x:4x4x1) to hold their bf16 weights.
MODELS = (("tiny-dense", 1), ("tiny-moe", 1), ("llama-3.2-1b", 1), ("gemma-3-1b", 1),
          ("gemma-2-2b", 4), ("phi-3-mini-4k", 4), ("qwen3-8b", 4), ("mistral-7b-v0.1", 8),
          ("olmo-2-7b", 8), ("qwen3-32b", 8), ("qwen3-30b-a3b", 8), ("mixtral-8x7b", 8),
          ("gpt-oss-20b", 8), ("qwen3.5-27b", 8), ("qwen3-next-80b-a3b", 8),
          ("deepseek-v3", 32), ("kimi-k2", 32))
# Interpret-mode stages (check, trace) run the kernel on this CPU: tiny models only.
INTERPRET = ("tiny-dense", "tiny-moe")
# AOT compile time of the 64-layer model against the same model cut to this many layers.
DEPTH_MODEL, DEPTH_CUT = "qwen3-32b", 4
TIMELINE_MODEL, TIMELINE_LAYERS = ("qwen3-32b", 8), 3
CHECK_STEPS = 2
REPLAY_CHART = "tiny-moe"      # its trace replays are drawn too

NUMBER_FIELDS = ("plan_s", "modeled_step_ms", "modeled_hbm_floor_ms", "modeled_efficiency",
                 "modeled_tokens_per_s_per_user", "modeled_bytes_per_step",
                 "min_bytes_per_step", "plan_vmem_bytes", "modeled_sync_step_ms",
                 "modeled_sync_overlap_step_ms", "modeled_sync_slowdown",
                 "modeled_state_bytes_per_step")
# Stage fields: a number when the stage ran, else the stage is in errors/skipped.
STAGE_FIELDS = {"codegen": ("codegen_s",),
                "aot": ("aot_compile_s", "compiled_vmem_bytes"),
                "check": ("check_s",),
                "trace": ("trace_s", "trace_bytes_per_step"),
                "replay": ("replay_s", "replay_step_ms"),
                "profile": ("profile_s", "core_work_ms")}


STAGES = ("plan",) + tuple(STAGE_FIELDS)


def _field(stage: str) -> str:
    return "plan_s" if stage == "plan" else STAGE_FIELDS[stage][0]


def libtpu_available() -> bool:
    return importlib.util.find_spec("libtpu") is not None


def _err(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip().replace("\n", " ")
    return text[:400]


# ---------------------------------------------------------------- one model

def bench_model(name: str, devices: int, *, batch: int = 1, layers: int | None = None,
                aot: bool | None = None, interpret: bool | None = None,
                out_dir=None, on_stage=None) -> dict:
    """Bench zoo model ``name`` on ``devices`` cores -> one JSON-able record.

    ``layers`` cuts the model (``Model.truncated``); ``aot`` (default: libtpu
    importable) and ``interpret`` (default: a tiny model) choose the optional
    stages. ``on_stage(record)`` is called after every stage."""
    from megakernel.compiler.pipeline import plan_model
    from megakernel.models import zoo

    from bench.timeline import expand, synchronised_us

    aot_reason = "libtpu not importable" if aot is None else "not requested (--no-aot)"
    aot = libtpu_available() if aot is None else aot
    interpret = name in INTERPRET if interpret is None else interpret
    rec = {"model": name, "cores": devices, "batch": batch, "layers": layers,
           "errors": {}, "skipped": {}}
    done = on_stage or (lambda r: None)

    model = zoo.model(name)
    if layers is not None:
        model = model.truncated(layers)
    rec["layers"] = len(model.layers)
    t = time.perf_counter()
    plan = plan_model(model, devices=devices, batch=batch, tokens=1)
    rec["plan_s"] = time.perf_counter() - t
    c = plan.cost
    rec.update(modeled_step_ms=c.step_ms, modeled_hbm_floor_ms=c.floor_ms,
               modeled_efficiency=c.efficiency,
               modeled_tokens_per_s_per_user=c.tokens_per_s_per_user,
               modeled_bytes_per_step=c.hbm_bytes_per_core,
               min_bytes_per_step=c.floor_bytes_per_core,
               plan_vmem_bytes=plan.memory.vmem_total, plan_digest=plan.digest(),
               # recurrent state (Gated DeltaNet) read and written whole each step, per core
               modeled_state_bytes_per_step=sum(s.bytes_per_step for s in plan.memory.states))
    from megakernel.compiler.floors import floors, modeled_compute_parts

    fl = floors(plan)
    mxu_ms, overhead_ms = modeled_compute_parts(c)
    rec.update(modeled_hbm_sustained_floor_ms=fl.hbm_sustained_ms, modeled_core_floor_ms=fl.core_ms,
               modeled_latency_floor_ms=fl.latency_ms, modeled_binding_floor=fl.binding,
               modeled_binding_efficiency=fl.efficiency, modeled_compute_ms=mxu_ms + overhead_ms,
               modeled_mxu_ms=mxu_ms, modeled_overhead_ms=overhead_ms)
    forms = sorted({g.geometry.form for g in plan.memory.geometries if g.library == "mla"})
    if forms:
        rec["mla_form"] = "/".join(forms)
    rec["modeled_step_ms_n16"] = plan_model(model, devices=devices, batch=batch, tokens=1,
                                            steps=16).cost.step_ms
    from bench.sensitivity import TARGETS, sensitivity

    rec["modeled_sensitivity"] = sensitivity(model, plan)
    if (name, devices) in TARGETS and layers is None:
        b8 = plan_model(model, devices=devices, batch=8, tokens=1).cost
        rec.update(modeled_step_ms_b8=b8.step_ms, modeled_efficiency_b8=b8.efficiency)
    sync = synchronised_us(expand(model, c).events)
    rec.update(modeled_sync_step_ms=sync["strict"] / 1e3,
               modeled_sync_overlap_step_ms=sync["overlap"] / 1e3,
               modeled_sync_slowdown=sync["strict"] / 1e3 / c.step_ms)
    done(rec)

    from megakernel.backends.pallas_tpu.aot.tpu_compile import aot_compile
    from megakernel.backends.pallas_tpu.check.kernel_check import check as check_kernel
    from megakernel.backends.pallas_tpu.codegen.load import compile_model

    tmp = tempfile.TemporaryDirectory(prefix=f"bench-{name}-") if out_dir is None else None
    kdir = Path(out_dir or tmp.name)
    try:
        kernel = _stage(rec, "codegen", lambda: compile_model(model, plan, kdir))
        if kernel is None and _collective_unsupported(rec["errors"]["codegen"]):
            # The backend emits only some collective algorithms: build the kernel
            # from the plan restricted to them; the modeled columns stay the
            # planner's own choice, the kernel's plan is recorded beside them.
            first = rec["errors"].pop("codegen")
            t = time.perf_counter()
            plan = plan_model(model, devices=devices, batch=batch, tokens=1,
                              overrides=KERNEL_FALLBACK)
            rec["kernel_plan_s"] = time.perf_counter() - t
            rec.update(kernel_overrides=KERNEL_FALLBACK, kernel_plan_reason=first,
                       kernel_modeled_step_ms=plan.cost.step_ms,
                       kernel_plan_vmem_bytes=plan.memory.vmem_total)
            kernel = _stage(rec, "codegen", lambda: compile_model(model, plan, kdir))
        done(rec)
        if not aot:
            rec["skipped"]["aot"] = aot_reason
        elif kernel is not None:
            res = _stage(rec, "aot", lambda: aot_compile(
                kdir, plan, topology=aot_topology(devices)))
            if res is not None:
                rec["compiled_vmem_bytes"] = res.vmem_used_bytes
                rec["aot_plan_vmem_bytes"] = res.plan_vmem_bytes
                rec["aot_compiler_reported_s"] = res.compile_seconds
                rec["aot_vmem_limit_bytes"] = getattr(res, "vmem_limit_bytes", None)
                rec["aot_topology"] = getattr(res, "topology", None)
                rec["aot_hbm_copies"] = len(res.copies)
                rec["aot_hbm_copy_bytes"] = res.copy_bytes
        else:
            rec["skipped"]["aot"] = "no kernel (codegen failed)"
        done(rec)
        _profile_stage(rec, plan, devices, aot and kernel is not None)
        done(rec)
        if not interpret:
            for stage in ("check", "trace", "replay"):
                rec["skipped"][stage] = "interpret mode: tiny models only"
            return rec
        if kernel is None:
            for stage in ("check", "trace", "replay"):
                rec["skipped"][stage] = "no kernel (codegen failed)"
            return rec
        from megakernel.models.weights import init_weights

        from megakernel.backends.pallas_tpu.codegen import load
        from megakernel.backends.pallas_tpu.check import trace_dmas as trace

        weights = init_weights(model, seed=0)
        module = load.import_module(kernel)       # checked, traced and replayed as built
        res = _stage(rec, "check", lambda: check_kernel(model, plan, weights,
                                                         steps=CHECK_STEPS, seed=0,
                                                         module=module))
        if res is not None:
            rec.update(check_ok=bool(res.ok), check_steps=res.steps,
                       check_max_abs_err=float(res.max_abs_err),
                       check_token_agreement=float(res.token_agreement))
        done(rec)
        traced = _stage(rec, "trace",
                        lambda: trace.trace_step(model, plan, weights, module=module))
        if traced is not None:
            rec.update(_trace_bytes(plan, traced))
        done(rec)
        if traced is None:
            rec["skipped"]["replay"] = "no trace (the trace stage failed)"
            return rec
        res = _stage(rec, "replay", lambda: _trace_replay(model, plan, weights, kdir, traced))
        if res is not None:
            rec.update(res)
        done(rec)
        return rec
    finally:
        if tmp is not None:
            tmp.cleanup()


KERNEL_FALLBACK = {"allreduce": "one_shot"}


def _profile_stage(rec, plan, devices, compiled) -> None:
    """Core work from libtpu's static schedule beside the modeled compute: two
    more AOT compiles at cut depths for every model (profile_kernel.py). Its
    profile builds keep each ring tile's semaphore constant, on which libtpu's
    profile pass aborted for kernels whose banks are computed from the layer
    index ("No DMA issue node found for sync flag"; docs/floors.md)."""
    if not compiled:
        rec["skipped"]["profile"] = "static profile: the AOT compile did not succeed"
        return
    from megakernel.backends.pallas_tpu.aot.profile_kernel import profile

    work = _stage(rec, "profile", lambda: profile(plan, topology=aot_topology(devices)))
    if work is not None:
        rec.update(core_work_ms=work.ms, core_work_headroom=work.headroom,
                   core_work_cycles=work.cycles, core_work_cuts=list(work.cuts))


def aot_topology(devices: int) -> str:
    """The smallest TPU7x topology with at least ``devices`` TensorCores."""
    from megakernel.cli.args import TOPOLOGIES

    return min((n, t) for t, n in TOPOLOGIES.items()
               if t.startswith("tpu7x:") and n >= max(devices, 8))[1]


def _collective_unsupported(error: str) -> bool:
    return error.startswith("EmitError: plan.collectives:")


def _stage(rec: dict, stage: str, fn):
    """Run ``fn`` timed as ``<stage>_s``; on failure record the error, return None."""
    t = time.perf_counter()
    try:
        out = fn()
    except Exception as exc:     # the bench reports every failure in its cell
        rec["errors"][stage] = _err(exc)
        rec.setdefault("tracebacks", {})[stage] = traceback.format_exc(limit=6)[-2000:]
        return None
    rec[STAGE_FIELDS[stage][0]] = time.perf_counter() - t
    return out


def _trace_bytes(plan, res) -> dict:
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


def _trace_replay(model, plan, weights, kdir, traced) -> dict:
    """The step replayed from the megakernel's trace (``traced``) and from the
    trace of its synchronised-ops variant (``bench/replay.py``; modeled), with
    both timelines drawn for the chart model."""
    from megakernel.backends.pallas_tpu.aot.tpu_compile import aot_compile
    from megakernel.backends.pallas_tpu.check.kernel_check import check as check_kernel
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


# ---------------------------------------------------------------- the run

def _worker(args) -> None:
    out = Path(args.json)

    def flush(rec):
        out.write_text(json.dumps(rec, indent=1))

    rec = bench_model(args.worker, args.devices, layers=args.layers,
                      aot=False if args.no_aot else None,
                      interpret=False if args.layers else None, on_stage=flush)
    flush(rec)


def _run_job(name, devices, layers, timeout, no_aot) -> dict:
    """One model in a worker process; a timeout keeps the stages it finished."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        path = Path(f.name)
    cmd = [sys.executable, "-m", "bench.run", "--worker", name, "--devices", str(devices),
           "--json", str(path)] + (["--layers", str(layers)] if layers else []) \
        + (["--no-aot"] if no_aot else [])
    t = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=Path(__file__).parent.parent, timeout=timeout,
                              capture_output=True, text=True)
        failure = None if proc.returncode == 0 else \
            f"worker exited {proc.returncode}: {proc.stderr.strip()[-300:]}"
    except subprocess.TimeoutExpired:
        failure = f"timeout: stage still running after {timeout:.0f} s (bench time budget)"
    try:
        rec = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        rec = {"model": name, "cores": devices, "batch": 1, "layers": layers,
               "errors": {}, "skipped": {}}
    path.unlink(missing_ok=True)
    rec["wall_s"] = time.perf_counter() - t
    if failure:
        pending = [s for s in STAGES if _field(s) not in rec
                   and s not in rec["errors"] and s not in rec["skipped"]]
        for k, s in enumerate(pending):
            if k == 0:
                rec["errors"][s] = failure
            else:
                rec["skipped"][s] = "not reached (" + failure.split(":")[0] + ")"
    return rec


def main(argv=None) -> int:
    import megakernel.kinds  # noqa: F401 - every op kind's rules
    p = argparse.ArgumentParser(prog="python -m bench.run")
    p.add_argument("--budget", type=float, default=20 * 60,
                   help="seconds for the whole bench (default 1200)")
    p.add_argument("--models", default=None, help="comma-separated subset of the zoo")
    p.add_argument("--no-aot", action="store_true")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    p.add_argument("--devices", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--layers", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--json", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        _worker(args)
        return 0

    t0 = time.perf_counter()
    deadline = t0 + args.budget - 45          # formats, timeline, JSON and table after the jobs
    wanted = set(args.models.split(",")) if args.models else None
    jobs = [(n, d, None) for n, d in MODELS if wanted is None or n in wanted]
    if wanted is None or DEPTH_MODEL in wanted:
        jobs.insert(len(INTERPRET), (DEPTH_MODEL, dict(MODELS)[DEPTH_MODEL], DEPTH_CUT))
    records, cut = [], None
    for i, (name, devices, layers) in enumerate(jobs):
        left = deadline - time.perf_counter()
        timeout = max(20.0, min(left - 5 * (len(jobs) - i - 1), 2.0 * left / (len(jobs) - i)))
        print(f"[bench] {name}{f' ({layers} layers)' if layers else ''} on {devices} core(s), "
              f"up to {timeout:.0f} s ...", flush=True)
        rec = _run_job(name, devices, layers, timeout, args.no_aot)
        if layers:
            cut = rec
        else:
            records.append(rec)

    RESULTS.mkdir(parents=True, exist_ok=True)
    summary = {"libtpu": libtpu_available()}
    full = next((r for r in records if r["model"] == DEPTH_MODEL), None)
    summary["aot_depth"] = _depth(full, cut)
    summary["timeline_png"] = _timeline_png(summary)
    from bench import formats

    quantized = [formats.format_record(*row) for row in formats.FORMAT_ROWS
                 if wanted is None or row[0] in wanted]
    summary["total_s"] = time.perf_counter() - t0
    out = {"format": FORMAT, "notes": NOTES, "models": records, "aot_depth_cut": cut,
           "formats": quantized, "summary": summary}
    (RESULTS / "bench.json").write_text(json.dumps(out, indent=1))
    from bench.table import render

    print()
    print(render(records, summary))
    if quantized:
        print("\n".join(formats.render(quantized)))
    return 0


NOTES = ("Timings (plan/codegen/AOT/check/trace, s) are wall clock on a shared 2-core CPU "
         "machine and noisy: compare ratios within one run, not across runs. Every "
         "'modeled' number comes from the planner's cost model, not a measurement. "
         "Check and trace run the kernel in the Pallas interpreter on CPU, so only the "
         "tiny models get them.")


def _depth(full, cut) -> dict:
    out = {"model": DEPTH_MODEL, "cut_layers": DEPTH_CUT}
    a, b = (full or {}).get("aot_compile_s"), (cut or {}).get("aot_compile_s")
    if a is not None and b is not None:
        out.update(full_layers=full["layers"], full_s=a, cut_s=b, ratio=a / b)
    else:
        missing = [r for r in (full, cut) if r is None or r.get("aot_compile_s") is None]
        why = [(r or {}).get("errors", {}).get("aot") or (r or {}).get("skipped", {}).get("aot")
               or "not run" for r in missing]
        out["error"] = "; ".join(w[:110] + "..." for w in why)
    return out


def _timeline_png(summary) -> str:
    try:
        from megakernel.compiler.pipeline import plan_model
        from megakernel.models import zoo

        from bench.timeline import expand, plot

        (name, devices), n = TIMELINE_MODEL, TIMELINE_LAYERS
        model = zoo.model(name)
        plan = plan_model(model, devices=devices, batch=1)
        path = RESULTS / "timeline.png"
        plot(expand(model, plan.cost), path, layers=n,
             title=f"{name} on {devices} TensorCores, batch 1: first {n} layers of one decode "
                   f"step (MODELED, step {plan.cost.step_ms:.3f} ms modeled)")
        return str(path)
    except Exception as exc:      # the table still prints
        return f"error: {_err(exc)}"


if __name__ == "__main__":
    sys.exit(main())
