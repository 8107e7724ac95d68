"""The bench's one table, as plain text, from the records ``bench.run`` collects.

A cell whose stage failed shows ``ERR<n>`` with the error's type and the
full message under the table as footnote <n>; a stage that did not apply
shows ``-`` with the reason in the notes. No cell is ever filled in for a
stage that did not produce its number.
"""

from __future__ import annotations

COLUMNS = ("model", "cores", "plan s", "codegen s", "AOT s", "step ms (modeled)",
           "step ms N=16 (modeled)",
           "HBM floor ms (modeled)", "eff. (modeled)",
           "floors ms HBM/3.2TB/core/lat", "binds: eff. (modeled)",
           "compute ms modeled/libtpu", "step ms libtpu compute (modeled)", "MLA form",
           "state MB/step (modeled)",
           "sync-ops ms (modeled)",
           "trace replay ms mega/sync (modeled)",
           "VMEM MiB compiled/plan (diff)", "XLA copies MiB/step N=1/16", "bytes/step trace/min", "check s")


def _mib(n) -> str:
    return f"{n / 2**20:.1f}"


def _bytes(n) -> str:
    return f"{n / 1e6:.2f}M" if n >= 1e5 else f"{n / 1e3:.1f}k"


def _plan_vmem(r) -> int:
    """The VMEM of the plan the kernel was built from (AotResult's, when given)."""
    for key in ("aot_plan_vmem_bytes", "kernel_plan_vmem_bytes", "plan_vmem_bytes"):
        if r.get(key) is not None:
            return r[key]
    raise KeyError("plan_vmem_bytes")


def _vmem(compiled, plan) -> str:
    if compiled is None:
        return f"n/a/{_mib(plan)}"
    return f"{_mib(compiled)}/{_mib(plan)} ({(compiled - plan) / 2**20:+.2f})"


DIFFERS = 0.15      # busy core work and modeled compute further apart than this are flagged
# libtpu's units that are not a weight push: the cost model's per-op and
# per-tile overheads stand for them (floors.modeled_compute_parts)
OTHER_UNITS = (("mxu_stream", "streaming"), ("vector", "vector"), ("cross_lane", "cross-lane"),
               ("scalar", "scalar"), ("dma_issue", "DMA issue"))


def _unit_ms(r) -> dict:
    """libtpu's core work per unit, in ms."""
    cycles = r.get("core_work_cycles") or {}
    total = sum(cycles.values())
    return {u: r["core_work_ms"] * c / total for u, c in cycles.items()} if total else {}


def _busy(r) -> float:
    """Core work without the DMA waits (stalls), which the cost model keeps on its
    HBM side, not its compute side: a MoE layer's routed experts are fetched
    after routing and waited for at the full HBM rate."""
    return r["core_work_ms"] - _unit_ms(r).get("stall", 0.0)


def _differs(r) -> bool:
    return abs(_busy(r) / r["modeled_compute_ms"] - 1) > DIFFERS


def _core_work(r) -> str:
    """libtpu's core work and its busy part, flagged where the busy part
    differs from the modeled compute by more than 15%."""
    busy = _busy(r)
    return (f"{r['core_work_ms']:.3f} (busy {busy:.3f}"
            + (f", x{busy / r['modeled_compute_ms']:.2f} DIFFERS)" if _differs(r) else ")"))


def why_differs(r) -> str:
    """Where a flagged row's busy core work and modeled compute part: the
    pushes against the modeled MXU time, and the rest of the busy work by unit
    against the modeled overheads that stand for it."""
    ms = _unit_ms(r)
    push, mxu, over = ms.get("mxu_push", 0.0), r["modeled_mxu_ms"], r["modeled_overhead_ms"]
    other = sum(ms.get(u, 0.0) for u, _ in OTHER_UNITS)
    parts = ", ".join(f"{name} {ms.get(u, 0.0):.3f}" for u, name in OTHER_UNITS)
    return (f"{r['model']}/{r['cores']}: {_busy(r) - r['modeled_compute_ms']:+.3f} = pushes "
            f"{push - mxu:+.3f} ({push:.3f} against MXU {mxu:.3f}) + the rest "
            f"{other - over:+.3f} ({parts} against overheads {over:.3f})")


class _Cells:
    """Formats one record's cells, collecting error footnotes and skip reasons."""

    def __init__(self, notes: list, skips: dict):
        self.notes, self.skips = notes, skips

    def stage(self, rec, stage, text):
        """``text()`` when the stage ran, else its error marker or '-'."""
        if stage in rec.get("errors", {}):
            msg = rec["errors"][stage]
            note = f"{rec['model']} {stage}: {msg}"
            if note not in self.notes:
                self.notes.append(note)
            return f"ERR{self.notes.index(note) + 1} {msg.split(':')[0][:18]}"
        if stage in rec.get("skipped", {}):
            self.skips.setdefault(rec["skipped"][stage], set()).add(stage)
            return "-"
        try:
            return text()
        except KeyError:
            return "?"

    def row(self, r) -> list[str]:
        s = self.stage
        cells = [r["model"] + (" *" if r.get("kernel_overrides") else ""), str(r["cores"])]
        cells.append(s(r, "plan", lambda: f"{r['plan_s']:.2f}"))
        cells.append(s(r, "codegen", lambda: f"{r['codegen_s']:.2f}"))
        cells.append(s(r, "aot", lambda: f"{r['aot_compile_s']:.1f}"))
        cells.append(s(r, "plan", lambda: f"{r['modeled_step_ms']:.3f}"))
        cells.append(s(r, "plan", lambda: f"{r['modeled_step_ms_n16']:.3f}"))
        cells.append(s(r, "plan", lambda: f"{r['modeled_hbm_floor_ms']:.3f}"))
        cells.append(s(r, "plan", lambda: f"{r['modeled_efficiency']:.1%}"))
        cells.append(s(r, "plan", lambda: f"{r['modeled_hbm_floor_ms']:.3f}/"
                                          f"{r['modeled_hbm_sustained_floor_ms']:.3f}/"
                                          f"{r['modeled_core_floor_ms']:.3f}/"
                                          f"{r['modeled_latency_floor_ms']:.3f}"))
        cells.append(s(r, "plan", lambda: f"{r['modeled_binding_floor']}: "
                                          f"{r['modeled_binding_efficiency']:.1%}"))
        cells.append(s(r, "plan", lambda: f"{r['modeled_compute_ms']:.3f}/")
                     + s(r, "profile", lambda: _core_work(r)))
        cells.append(s(r, "profile", lambda: f"{r['modeled_step_core_ms']:.3f} "
                                             f"(compute x{r['modeled_compute_scale']:.2f})"))
        cells.append(s(r, "plan", lambda: r.get("mla_form", "-")))
        cells.append(s(r, "plan", lambda: f"{r.get('modeled_state_bytes_per_step', 0) / 1e6:.1f}"))
        cells.append(s(r, "plan", lambda: f"{r['modeled_sync_step_ms']:.3f} "
                                          f"(x{r['modeled_sync_slowdown']:.2f})"))
        cells.append(s(r, "replay", lambda: f"{r['replay_step_ms']:.4f}/"
                                            f"{r['replay_sync_step_ms']:.4f} "
                                            f"(x{r['replay_sync_slowdown']:.2f}; "
                                            f"{r['replay_over_modeled'] - 1:+.0%} vs step)"))
        cells.append(s(r, "aot", lambda: _vmem(r["compiled_vmem_bytes"], _plan_vmem(r)))
                     if "plan_s" in r else s(r, "plan", lambda: ""))
        cells.append(s(r, "aot", lambda: f"{_mib(r['aot_hbm_copy_bytes'])}/"
                                          f"{_mib(r['aot_hbm_copy_bytes'] / 16)}"))
        cells.append(s(r, "trace", lambda: f"{_bytes(r['trace_bytes_per_step'])}/"
                                           f"{_bytes(r['min_bytes_per_step'])}"))
        cells.append(s(r, "check", lambda: f"{r['check_s']:.1f}"
                                           + ("" if r.get("check_ok") else " FAIL")))
        return cells


def _grid(columns, rows: list[list[str]]) -> list[str]:
    """Header, rule and rows, each column as wide as its widest cell; model and
    cores left-aligned, numbers right-aligned."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h)
              for i, h in enumerate(columns)]
    line = lambda cs: "  ".join(c.rjust(w) if i > 1 else c.ljust(w)  # noqa: E731
                                for i, (c, w) in enumerate(zip(cs, widths))).rstrip()
    return [line(columns), line(["-" * w for w in widths])] + [line(r) for r in rows]


XLA_COLUMNS = ("model", "cores", "XLA step ms (modeled)", "megakernel ms (modeled)",
               "x (modeled)", "XLA ops/gaps ms (modeled)", "HBM MB XLA/mega (modeled)",
               "XLA core work ms (libtpu)", "megakernel (libtpu)", "x (libtpu)")


def xla_table(records: list[dict], cells: "_Cells") -> list[str]:
    """The XLA baseline beside the megakernel, one row per model: the modeled
    steps and their ratio, libtpu's schedules and theirs (bench/xla_baseline.py)."""
    s = cells.stage
    rows = [[r["model"], str(r["cores"]),
             s(r, "xla", lambda: f"{r['xla_modeled_step_ms']:.3f}"),
             s(r, "plan", lambda: f"{r['modeled_step_ms']:.3f}"),
             s(r, "xla", lambda: f"{r['xla_modeled_advantage']:.2f}x"),
             s(r, "xla", lambda: f"{r['xla_modeled_ops']:.0f}/{r['xla_modeled_gap_ms']:.3f}"),
             s(r, "xla", lambda: f"{r['xla_modeled_hbm_bytes'] / 1e6:.0f}/"
                                 f"{r['modeled_bytes_per_step'] / 1e6:.0f}"),
             s(r, "xla_profile", lambda: f"{r['xla_core_work_ms']:.3f}-"
                                         f"{r['xla_core_work_serial_ms']:.3f}"),
             s(r, "profile", lambda: f"{r['core_work_ms']:.3f}"),
             s(r, "xla_profile", lambda: f"{r['xla_core_work_advantage']:.2f}x")]
            for r in records]
    return ["", "The XLA baseline: the same step as XLA ops over the same cores "
            "(bench/xla_baseline.py)"] + _grid(XLA_COLUMNS, rows) + [
        "XLA step (modeled): the reference step jitted over the plan's cores, compiled by "
        "libtpu for the same topology, each",
        "  op max(HBM bytes at the sustained bandwidth, compute) + a dispatch gap "
        "(op_overhead_s, + dma_latency_s if it touches",
        "  HBM), collectives by the phase model (bench/xla_cost.py); x = XLA / megakernel, its "
        "advantage by the cost model; HBM MB per core.",
        "XLA core work (libtpu): libtpu's static schedule of the same step's ops (caches read "
        "only), their estimates summed;",
        "  without (-with) its async prefetches at the profile's DMA rate, which libtpu does "
        "not estimate; x = the first over",
        "  the megakernel's core work (its critical path, stalls included): its advantage "
        "by libtpu's account. Both scaled from two cut depths."]


def render(records: list[dict], summary: dict) -> str:
    notes, skips = [], {}
    cells = _Cells(notes, skips)
    out = _grid(COLUMNS, [cells.row(r) for r in records])
    out.append("")
    d = summary.get("aot_depth", {})
    if "ratio" in d:
        out.append(f"AOT compile, {d['model']} {d['full_layers']} layers vs {d['cut_layers']}: "
                   f"{d['full_s']:.1f} s / {d['cut_s']:.1f} s = {d['ratio']:.2f}x")
    else:
        out.append(f"AOT compile, {d.get('model')} full vs {d.get('cut_layers')} layers: "
                   f"not available ({d.get('error', 'not run')})")
    out += [
        "sync-ops (modeled): the same plan with every op synchronised (each DMA waited for "
        "before its op's compute, nothing",
        "  fetched ahead across op or layer boundaries; bench/timeline.py), x = its slowdown "
        "over the megakernel's modeled step.",
        "trace replay (modeled): one step replayed from the trace of the kernel's own DMA "
        "starts and waits, and of its",
        "  synchronised-ops variant (the same plan emitted with no DMA ahead across op "
        "boundaries), with the cost model's",
        "  rates (bench/replay.py); x = the variant's slowdown. Tiny models only "
        "(the trace runs in the interpreter).",
        "  The replay serves the DMAs with the cost model's own DMA model (compiler/"
        "dma_service.py) and charges the cost model's",
        "  compute on the ring tiles as they land, so '+N% vs step' (replay / modeled "
        "step) is what the kernel's DMA order",
        "  and waits add; its stalls by DMA kind are in bench.json (replay_stall_ms_by_kind).",
        "bytes/step: HBM bytes one step of the executed kernel read (trace mode: the kernel "
        "run in the interpreter, tiny",
        "  models only) / the minimum the HBM floor counts (valid weights + KV + vectors), "
        "per core; writes etc. in bench.json.",
        "XLA copies: bytes per core XLA copies around the compiled kernel each call (AOT "
        "HLO): with remote DMAs in the kernel",
        "  it copies every output and aliased operand (docs/verification.md): the KV "
        "caches are read only, so what is left is the step scalars, next_token and "
        "whole-access (GDN) state; per step: N=1 one call's copies,",
        "  N=16 the same call's copies over its 16 steps (a 16-step kernel has the same "
        "operands and outputs; AOT-checked",
        "  for tiny-moe/4 and qwen3-32b/8, tests/backends/test_aot_multistep.py).",
        "step ms N=16 (modeled): the plan for 16 steps per call (--steps-per-call 16), per "
        "step: the launch paid once per call.",
        "floors (modeled, compiler/floors.py): HBM bytes per core at nominal and at 3.2 TB/s "
        "sustained (Inferact), core = MXU",
        "  weight loads at the calibrated rates (compiler/calibration.json), latency = launch "
        "share + collective phases; binds: eff. = the largest (HBM at the sustained rate) / "
        "modeled step.",
        "compute ms modeled/libtpu: the cost model's compute side (MXU + overheads) / the "
        "kernel's critical path in libtpu's static",
        "  schedule, profiled at two cut depths and scaled per layer (docs/floors.md); busy: "
        "without its DMA waits (stalls),",
        "  which the cost model keeps on its HBM side; DIFFERS marks busy and modeled > 15% "
        "apart.",
        "step ms libtpu compute (modeled): the step re-modeled with every phase's compute "
        "scaled so the step's compute is at least",
        "  libtpu's busy core work (floors.with_core_work; x1.00 where the model already "
        "charges more): no modeled step below the core work.",
        "check s: interpret-mode check of 2 decode steps vs the plain-JAX reference "
        "(FAIL = disagreed).",
        "MLA form: the multi-head latent attention form the cost model chose (absorbed or "
        "expanded; the plan's choices give both modeled costs).",
        "state MB/step (modeled): recurrent state (Gated DeltaNet conv histories and delta-rule "
        "states) read and written",
        "  whole every step, per core, as planned (plan.memory.states); counted in the step "
        "time and the HBM floor.",
        "Timings are wall clock on a shared 2-core CPU machine, noisy: compare ratios within "
        "one run. 'modeled' = cost model, not a measurement.",
    ]
    from bench.sensitivity import render as sensitivity, render_targets

    out += render_targets(records) + sensitivity(records)
    out += xla_table(records, cells)
    fallback = [r for r in records if r.get("kernel_overrides")]
    if fallback:
        o = ", ".join(f"{k}={v}" for k, v in fallback[0]["kernel_overrides"].items())
        out.append(f"* kernel (codegen/AOT/VMEM plan) built from the plan with overrides {o}, "
                   "as the backend emits only that; modeled columns are the planner's choice ("
                   + "; ".join(f"{r['model']}: kernel's plan {r['kernel_modeled_step_ms']:.3f} "
                               "ms modeled" for r in fallback) + ").")
    for why, stages in sorted(skips.items()):
        out.append(f"'-' ({', '.join(sorted(stages))}): {why}")
    why = [why_differs(r) for r in records if "core_work_ms" in r and "modeled_mxu_ms" in r
           and not r.get("errors", {}).get("profile") and _differs(r)]
    if why:
        out.append("compute DIFFERS, by unit (ms, libtpu busy - modeled; docs/floors.md says "
                   "why per row):")
        out += [f"  {w}" for w in why]
    if notes:
        out.append("Errors:")
        out += [f"  [{i}] {n}" for i, n in enumerate(notes, 1)]
    png = summary.get("timeline_png", "")
    out.append(f"timeline: {png}" if not png.startswith("error") else f"timeline PNG {png}")
    if "total_s" in summary:
        out.append(f"total bench time: {summary['total_s']:.0f} s")
    return "\n".join(out)
