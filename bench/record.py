"""One model's bench record: each stage of ``make bench`` timed, or its error.

``bench_model(name, devices)`` plans zoo model ``name`` (the cost model's
numbers, floors, sensitivity and synchronised-ops ablation, all modeled),
generates its kernel, compiles it with libtpu when importable, profiles
libtpu's static schedule of it, measures the XLA baseline the same two ways
(bench/xla_baseline.py), and for the tiny models runs the
interpret-mode check, trace and replay (``bench/interpret.py``). The record's
fields are listed in ``bench/config.py``; a stage that fails leaves its error
in ``errors`` and no number.
"""

from __future__ import annotations

import importlib.util
import tempfile
import time
import traceback
from pathlib import Path

from bench.config import CHECK_STEPS, INTERPRET, STAGE_FIELDS
from bench.interpret import trace_bytes, trace_replay


def libtpu_available() -> bool:
    return importlib.util.find_spec("libtpu") is not None


def error_text(exc: BaseException) -> str:
    """One line of at most 400 characters for a stage's error cell."""
    text = f"{type(exc).__name__}: {exc}".strip().replace("\n", " ")
    return text[:400]


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
               modeled_sustained_efficiency=fl.sustained_efficiency,
               modeled_mxu_ms=mxu_ms, modeled_overhead_ms=overhead_ms)
    forms = sorted({g.geometry.form for g in plan.memory.geometries if g.library == "mla"})
    if forms:
        rec["mla_form"] = "/".join(forms)
    rec["modeled_step_ms_n16"] = plan_model(model, devices=devices, batch=batch, tokens=1,
                                            steps=16).cost.step_ms
    from bench.sensitivity import TARGETS, sensitivity

    rec["modeled_sensitivity"] = sensitivity(model, plan)
    if (name, devices) in TARGETS and layers is None:
        p8 = plan_model(model, devices=devices, batch=8, tokens=1)
        rec.update(modeled_step_ms_b8=p8.cost.step_ms, modeled_efficiency_b8=p8.cost.efficiency,
                   modeled_sustained_efficiency_b8=floors(p8).sustained_efficiency)
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
        _xla_stages(rec, plan, devices, aot, aot_reason, done)
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
            rec.update(trace_bytes(plan, traced))
        done(rec)
        if traced is None:
            rec["skipped"]["replay"] = "no trace (the trace stage failed)"
            return rec
        res = _stage(rec, "replay", lambda: trace_replay(model, plan, weights, kdir, traced))
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

    from megakernel.compiler.floors import with_core_work

    work = _stage(rec, "profile", lambda: profile(plan, topology=aot_topology(devices)))
    if work is not None:
        rec.update(core_work_ms=work.ms, core_work_headroom=work.headroom,
                   core_work_cycles=work.cycles, core_work_cuts=list(work.cuts))
        # busy: without the DMA waits (stalls), which the cost model keeps on its
        # HBM side; the step re-modeled with at least that much compute
        total = sum(work.cycles.values())
        busy = work.ms * (1 - work.cycles.get("stall", 0) / total) if total else work.ms
        scale, cost = with_core_work(plan, busy)
        rec.update(core_busy_ms=busy, modeled_compute_scale=scale,
                   modeled_step_core_ms=cost.step_ms)


def _xla_stages(rec, plan, devices, aot, why_not, done) -> None:
    """The baseline a user would pick instead (bench/xla_baseline.py): the same
    step as XLA ops over the same cores, compiled by libtpu for the same
    topology; its modeled step, then libtpu's static schedule of its ops, each
    over the megakernel's own figure (its advantage by the compiler's account)."""
    if not aot:
        rec["skipped"]["xla"] = rec["skipped"]["xla_profile"] = why_not
        return
    from bench import xla_baseline

    topology = aot_topology(devices)
    cost = _stage(rec, "xla", lambda: xla_baseline.modeled(plan, topology=topology))
    if cost is not None:
        rec.update(xla_baseline.modeled_fields(cost),
                   xla_cuts=list(xla_baseline.cut_depths(plan.model)[:2]),
                   xla_modeled_advantage=cost.step_s * 1e3 / rec["modeled_step_ms"])
    done(rec)
    work = _stage(rec, "xla_profile", lambda: xla_baseline.core_work(plan, topology=topology))
    if work is not None:
        rec.update(xla_core_work_ms=work.ms, xla_core_work_serial_ms=work.serial_ms,
                   xla_core_work_ops=work.ops, xla_async_bytes=work.async_bytes)
        if rec.get("core_work_ms"):
            rec["xla_core_work_advantage"] = work.ms / rec["core_work_ms"]
    done(rec)


def aot_topology(devices: int) -> str:
    """The smallest TPU7x topology with at least ``devices`` TensorCores."""
    from megakernel.chips import TOPOLOGIES

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
        rec["errors"][stage] = error_text(exc)
        rec.setdefault("tracebacks", {})[stage] = traceback.format_exc(limit=6)[-2000:]
        return None
    rec[STAGE_FIELDS[stage][0]] = time.perf_counter() - t
    return out
