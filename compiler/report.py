"""Render a plan for people: markdown (``markdown``) or plain terminal text (``terminal``).

Both show the same sections: the modeled step (time, tokens/s per user, HBM
floor, efficiency, always labelled as modeled), the choices made, sharding and
its padding, VMEM against the budget with the headroom, the ring geometry,
the collectives of each layer, the costliest phases, and every buffer with its
space, shape, size and lifetime.
"""

from __future__ import annotations

from megakernel import dtypes
from megakernel.compiler.buffers import Space
from megakernel.compiler.cost import LABEL
from megakernel.compiler.floors import duration, floors
from megakernel.compiler.layout import itemsize, mib, padded_shape, size_text as _size
from megakernel.compiler.plan import Plan
from megakernel.compiler.report_ring import ring_lines


def _table(headers, rows, md: bool) -> list[str]:
    rows = [[str(c) for c in r] for r in rows]
    if md:
        out = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
        return out + ["| " + " | ".join(r) + " |" for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h)
              for i, h in enumerate(headers)]
    line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    return [line(headers), line(["-" * w for w in widths])] + [line(r) for r in rows]


def _steps_rule(plan: Plan) -> list[str]:
    """What ``--steps-per-call auto`` would choose for this request (a plan made
    with auto says it under Choices instead)."""
    from megakernel.compiler.choose_steps import recommend

    if any(k == "steps_per_call" for k, _ in plan.choices):
        return []
    return [f"steps per call requested; --steps-per-call auto would choose: "
            f"{recommend(plan).describe()}"]


def _sections(plan: Plan, md: bool) -> list[tuple[str, list[str]]]:
    c, m, t, r = plan.cost, plan.memory, plan.target, plan.request
    labels = [p.label for p in m.points]
    out = []
    out.append((f"Step time: {LABEL}", [
        f"modeled step time: {duration(c.step_ms)} per step",
        f"steps per call: {c.steps_per_call} (modeled call {duration(c.call_ms)}: launch "
        f"{duration(c.launch_ms)}, XLA's copies {duration(c.copy_ms)} and the state commit "
        f"{duration(c.commit_ms)} once, the steps' costs {c.steps_per_call} times)",
        f"XLA copies around the call: {_size(c.copy_bytes)} per core per call (modeled, "
        "compiler/xla_copies.py; `megakernel aot` lists the compiler's)",
        *_steps_rule(plan),
        f"modeled tokens/s per user: {c.tokens_per_s_per_user:,.1f}",
        *floors(plan).lines(),
    ]))
    out.append(("Choices", [f"{k}: {v}" for k, v in plan.choices]))
    shard_lines = []
    for st in plan.shard.stacks:
        for node, q, kv, rep in st.heads:
            shard_lines.append(f"stack {st.stack} (layers {st.start}..{st.start + st.layers - 1}) "
                               f"{node}: {q} q heads, {kv} kv head(s) per core"
                               + (f", each kv head on {rep} cores" if rep > 1 else ""))
        for node, ep, tp, local, width in st.experts:
            shard_lines.append(f"stack {st.stack} {node}: expert parallel {ep} x tensor parallel "
                               f"{tp}: {local} experts per core, intermediate {width} per core")
        for s in st.states:
            b = m.buffer(f"hbm.s{st.stack}.{s.node}.{s.name}")
            row = (f"; {b.shape[-1] * itemsize(b.dtype):,} B per token per layer"
                   if s.access == "append" else "")
            shard_lines.append(
                f"stack {st.stack} {s.node}.{s.name} ({s.access} state): "
                f"{'x'.join(map(str, b.shape))} {b.dtype}, {_size(b.nbytes)} per core{row}, "
                + ("replicated on every core" if not s.splits else "split over the cores"))
    for g in m.geometries:         # op libraries that say how their op is split
        if hasattr(g.geometry, "describe"):
            st = plan.shard.stacks[g.stack]
            shard_lines.append(f"stack {g.stack} (layers {st.start}..{st.start + st.layers - 1}) "
                               f"{g.node}: {g.geometry.describe()}")
    shard_lines.append(f"vocabulary: {plan.shard.vocab_stride} per core, padded to "
                       f"{plan.shard.vocab_local}")
    pads = plan.shard.padding()
    if pads:
        shard_lines += _table(["weight", "full", "per core", "padding/core"],
                              [(n, f, s, _size(b)) for n, f, s, b in pads], md)
    tiled = [(f"stack{st.stack}.{p.name}", p.shape, padded_shape(p.shape, p.dtype))
             for st in plan.shard.stacks for p in st.params
             if len(p.shape) >= 2 and padded_shape(p.shape, p.dtype) != tuple(p.shape)]
    if tiled:
        shard_lines.append("VMEM tile layout pads (no HBM padding): " + "; ".join(
            f"{n} {s} -> {q}" for n, s, q in tiled[:8]) + (" ..." if len(tiled) > 8 else ""))
    out.append(("Sharding", shard_lines))
    if plan.model.quantize.chosen():
        out.append(("Weight formats (bytes streamed per step per core)", _format_lines(plan, md)))
    vm = m.vmem_total
    peak = max(m.live_vmem(p.index) for p in m.points)
    out.append(("VMEM", [
        f"total {mib(vm)} of budget {mib(m.vmem_budget)} ({mib(t.vmem_bytes)} capacity - "
        f"{mib(t.vmem_reserve)} reserve); headroom {mib(m.vmem_budget - vm)}",
        f"peak live at one program point: {mib(peak)}; SMEM {_size(m.smem_total)}; "
        f"{m.semaphore_count} semaphores; HBM per core {m.hbm_total / 1e9:.2f} GB"]))
    static, every = m.stream.constant_tiles(plan.request.steps)
    banks = ("a constant bank per tile: the banks divide every layer's tiles"
             if static == every else
             f"a constant bank for {static} of the layers' {every} tiles (the runs of "
             "layers each a whole number of turns of the ring), the rest computed from "
             "the layer index" if static else
             "each layer's banks computed from its index")
    ring = ring_lines(plan) + [f"{m.stream.total} tiles per step; {banks}"]
    for s in m.stream.stacks:
        ring.append(f"stack {s.stack}: {s.per_layer} tiles per layer "
                    f"({s.bytes_per_layer / 2**20:.2f} MiB), first tile at stream index {s.offset}")
    ring.append(f"LM head: {len(m.stream.head)} tiles from index {m.stream.head_offset}, "
                f"{m.stream.head_block}-column logits blocks")
    for e in m.experts:
        ring.append(f"stack {e.stack} {e.node}: {e.slots} expert slots x {_size(e.slot_bytes)}; "
                    f"{e.chunks} slice(s) of {e.chunk} per expert; worst case {e.max_distinct} "
                    "distinct experts per layer")
    for k in m.kv:
        ring.append(f"stack {k.stack} {k.node}: KV tile {k.kv_tile} tokens, "
                    f"{k.tiles_per_seq} tiles per sequence for {k.read_tokens} valid tokens")
    out.append(("Ring geometry", ring))
    if m.states:
        out.append(("Recurrent state (read only in the kernel; the call's updates committed "
                    "after it)", _state_lines(plan, md)))
    rows = []
    for site in plan.collectives.sites:
        spec = plan.collectives.spec(site.spec)
        where = f"stack {site.stack}" if site.stack is not None else "once"
        # a site wider than hidden (a per-slot MoE's picks) moves ``fold`` pieces
        rows.append((site.name, where, f"{site.producer} -> {site.consumer}", spec.algorithm,
                     _size(spec.payload_bytes * site.fold), spec.wire,
                     f"{spec.site_seconds(site.fold, plan.target) * 1e6:.1f}",
                     site.parity(), site.overlap_count))
    out.append(("Collectives", _table(["site", "runs", "between", "algorithm", "payload",
                                       "wire", "modeled us", "parity", "tiles in flight"],
                                      rows, md)
                if rows else ["none (one TensorCore)"]))
    top = sorted(c.phases, key=lambda p: -p.time_s * p.per_step)[:10]
    out.append(("Costliest phases (modeled)", _table(
        ["phase", "x", "HBM MB", "HBM us", "ahead us", "MXU us", "overhead us", "wait us",
         "time us"],
        [(p.name, p.per_step, f"{p.hbm_bytes / 1e6:.2f}", f"{p.hbm_s * 1e6:.2f}",
          f"{p.prefetched_s * 1e6:.2f}", f"{p.mxu_s * 1e6:.2f}", f"{p.overhead_s * 1e6:.2f}",
          f"{p.stall_s * 1e6:.2f}", f"{p.time_s * 1e6:.2f}") for p in top], md)
        + [""] * md + [          # markdown: a blank line ends the table before the note
        "per occurrence, x times a step; HBM us: all the phase's bytes at the modeled DMA "
        "bandwidth; ahead us: the part of them the weight ring streamed during earlier "
        "phases (while those waited or computed, up to its banks' worth), so a phase can "
        "take less than its HBM us; time us = max(HBM us - ahead us, MXU us + overhead us) "
        "+ wait us"]))
    buf_rows = [(b.name, b.space.value, "x".join(map(str, b.shape)), b.dtype,
                 _size(b.nbytes) if b.space != Space.SEMAPHORE else f"{b.count} sems",
                 f"{labels[b.first]}..{labels[b.last]}") for b in m.buffers]
    out.append(("Buffers", _table(["name", "space", "shape", "dtype", "size", "lifetime"],
                                  buf_rows, md)))
    return out


def _state_lines(plan: Plan, md: bool) -> list[str]:
    """Every whole-access state: each part's per-core slice in HBM (read only
    in the kernel) and the bytes the kernel reads of it per step; the update
    windows the kernel returns, and the commit after the call."""
    m = plan.memory
    rows = []
    for s in m.states:
        for part, nbytes in zip(s.parts, s.part_bytes):
            op = m.buffer(f"hbm.s{s.stack}.{s.node}.{part}")
            new = m.buffer(f"new.s{s.stack}.{s.node}.{part}")
            rows.append((f"stack {s.stack} {s.node}.{part}", "x".join(map(str, op.shape[1:])),
                         op.dtype, _size(nbytes), s.count, _size(nbytes * s.count),
                         "x".join(map(str, new.shape[1:]))))
    total = sum(s.bytes_per_step for s in m.states)
    commit = sum(s.commit_bytes for s in m.states)
    back = (", read back on every later step of the call" if plan.request.steps > 1 else "")
    return _table(["state", "per core, per layer", "dtype", "bytes/layer", "layers",
                   "HBM read/step", "updates/layer"], rows, md) + [
        f"kernel total per step per core: {_size(total)} ({total:,} bytes; every layer's "
        "state is read into VMEM one repetition ahead and never written: the call's "
        f"updates (the conv rows windows; per value head the key, delta-rule update "
        f"and summed log-decay of each row) are "
        f"stored to small outputs{back})",
        f"commit after the call, in the same jit (backends/pallas_tpu/kernels/state_commit.py): "
        f"{_size(commit)} per core per call ({commit:,} bytes: each state read and written "
        "once, its updates read; the conv rows shifted in, the recurrent state "
        "exp(G) S_0 + K^T U~ in float32)"]


def _format_lines(plan: Plan, md: bool) -> list[str]:
    """Per format: the ring's bytes of one step per core, codes and scales
    apart, against the same weights in the model dtype."""
    stream, item = plan.memory.stream, itemsize(plan.model.dtype)
    rows: dict[str, list[int]] = {}
    tiles = [(st.count * st.layers_of(j), t) for st in stream.stacks
             for j, t in enumerate(st.tiles)]
    tiles += [(1, t) for t in stream.head]
    for count, t in tiles:          # a quantized tile's bytes include its scales'
        row = rows.setdefault(t.format, [0, 0, 0])
        codes = t.elements * dtypes.of(t.dtype).bits // 8
        row[0] += count * codes
        row[1] += count * (t.nbytes - codes)
        row[2] += count * t.elements * item
    total = sum(r[0] + r[1] for r in rows.values())
    body = [(fmt, _size(c), _size(sc), _size(c + sc), _size(plain), f"{(c + sc) / plain:.2f}")
            for fmt, (c, sc, plain) in sorted(rows.items())]
    lines = _table(["format", "codes", "scales", "streamed", f"as {plan.model.dtype.value}",
                    "ratio"], body, md) + [
        f"weight ring per step per core: {_size(total)} ({total:,} bytes; every byte the "
        "kernel's ring DMAs move, equal to trace mode's)"]
    for e in plan.memory.experts:
        layers = plan.shard.stacks[e.stack].reps(e.node)     # a run's: every run-layer
        worst = layers * e.bytes_per_layer
        plain = layers * e.max_distinct * e.chunks * 3 * e.hidden * e.chunk * item
        lines.append(f"stack {e.stack} {e.node} routed experts ({e.format}): at most "
                     f"{_size(worst)} per step per core (codes and scales), "
                     f"{_size(plain)} as {plan.model.dtype.value}")
    return lines


def _header(plan: Plan) -> str:
    r, t = plan.request, plan.target
    return (f"Plan {plan.digest()} for {plan.model.name} on {t.cores} x {t.chip} TensorCores "
            f"({t.topology.name}); batch {r.batch}, {r.tokens} token(s)/step, context {r.context}")


def markdown(plan: Plan) -> str:
    lines = [f"# {_header(plan)}", ""]
    for title, body in _sections(plan, md=True):
        lines += [f"## {title}", ""] + body + [""]
    return "\n".join(lines)


def terminal(plan: Plan, *, buffers: bool = True) -> str:
    lines = [_header(plan), ""]
    for title, body in _sections(plan, md=False):
        if title == "Buffers" and not buffers:
            continue
        lines += [title, "=" * len(title)] + body + [""]
    return "\n".join(lines)
