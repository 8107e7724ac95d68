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
replay charts ``bench/results/replay_tiny-moe{,_sync}.png``. After the models:
the weight-format rows (``bench/formats.py``) and Muse Spark against
Inferact's twelve measured steps (``bench/musespark.py``, docs/musespark.md).

This module runs the jobs and writes the results; ``bench/config.py`` names the
models and fields, ``bench/record.py`` benches one model, ``bench/table.py``
prints the table.
"""

from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import argparse  # noqa: E402
import json  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

from bench.config import (DEPTH_CUT, DEPTH_MODEL, FORMAT, INTERPRET, MODELS,  # noqa: E402
                          RESULTS, STAGES, TIMELINE_LAYERS, TIMELINE_MODEL, field)
from bench.musespark import CARD as MUSE_CARD  # noqa: E402
from bench.record import bench_model, error_text, libtpu_available  # noqa: E402


MUSE_RESERVE = 600.0     # seconds kept for bench/musespark.py


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
        pending = [s for s in STAGES if field(s) not in rec
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
    # 20 minutes held every stage up to the kernel's profile (1,051 s at a4b651f);
    # the XLA baseline adds 20-45 s a model (qwen3-8b/4 43 s, qwen3-30b-a3b/8 20 s).
    # Muse Spark's six full-size AOT compiles take 36-90 s each (MUSE_RESERVE).
    p.add_argument("--budget", type=float, default=40 * 60,
                   help="seconds for the whole bench (default 2400)")
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
    wanted = set(args.models.split(",")) if args.models else None
    muse_wanted = wanted is None or MUSE_CARD in wanted
    # formats, timeline, JSON and table after the jobs, and Muse Spark's rows
    deadline = t0 + args.budget - 45 - (MUSE_RESERVE if muse_wanted else 0)
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
    from bench import musespark

    muse = None
    if muse_wanted:
        muse = musespark.record(aot=not args.no_aot and libtpu_available(),
                                deadline=t0 + args.budget)
    summary["total_s"] = time.perf_counter() - t0
    out = {"format": FORMAT, "notes": NOTES, "models": records, "aot_depth_cut": cut,
           "formats": quantized, "musespark": muse, "summary": summary}
    (RESULTS / "bench.json").write_text(json.dumps(out, indent=1))
    from bench.table import render

    print()
    print(render(records, summary))
    if quantized:
        print("\n".join(formats.render(quantized)))
    if muse:
        print("\n".join(musespark.render(muse)))
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
        return f"error: {error_text(exc)}"


if __name__ == "__main__":
    sys.exit(main())
