"""The XLA step's modeled time: its compiled program, op by op, at the cost model's constants.

After ``model(module, target)``: an ``XlaCost`` of one core's program (the SPMD
partition XLA compiled, in the order it runs), every number modeled:

- each TensorCore op (a fusion, or an unfused op) costs max(its HBM bytes at the
  sustained bandwidth, its compute) plus its dispatch gap. Its HBM bytes are its
  operands and result that live in HBM (memory space 0), a fused slice or
  gather counting only what it reads, an in-place update only what it writes;
  its compute is each matmul's MXU weight loads or flops, whichever binds, at
  the calibrated rate of its dtype, precision and layout (compiler/calibration.json,
  as the core floor reads them), plus one VPU op per element of its other work;
- the async copies of XLA's memory-space assignment (HBM <-> VMEM prefetches and
  slices) move while the ops between their start and done leave the HBM path
  idle; at the done the core waits for what is left;
- each collective costs the collective schedule's phase model
  (``schedule_collectives.phase_seconds``; an all-reduce the cheaper of one shot
  and reduce-scatter + all-gather, as the planner chooses for the megakernel)
  plus the gap; scalar-unit ops (results in SMEM, or one element) and buffer
  bookkeeping cost nothing; the program's launch is paid once.

The dispatch gap is no new constant: every op pays ``op_overhead_s``, the fixed
cost the cost model gives a small op, and one that reads or writes HBM also one
exposed ``dma_latency_s``, as its own DMAs start when it does (what
memory-space assignment prefetched into VMEM is there already; compiler/target.py
for both). The sustained bandwidth is the one a ring of many DMAs reaches
(``hbm_efficiency`` x peak): XLA's fusions are granted it.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass

from megakernel.compiler import calibration
from megakernel.compiler.schedule_collectives import phase_seconds

from bench.xla_hlo import HBM, SMEM, VMEM, Array, Instr, Module

FREE = {"parameter", "constant", "bitcast", "get-tuple-element", "tuple", "partition-id",
        "replica-id", "after-all", "opt-barrier", "copy-done", "slice-done"}
ASYNC = {"copy-start": 0, "slice-start": 1}       # opcode -> index of the destination
COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
VIEWS = {"bitcast", "reshape", "get-tuple-element", "copy"}    # inside a fusion: no work
SLICES = {"dynamic-slice", "slice", "gather"}
IN_PLACE = {"dynamic-update-slice": 1, "scatter": 2}           # opcode -> the update operand
MATMULS = {"convolution", "dot"}
DTYPES = {"bf16": "bfloat16", "f32": "float32", "f8e4m3fn": "float8_e4m3fn", "s8": "int8",
          "s4": "int4"}


@dataclass(frozen=True)
class XlaCost:
    step_s: float
    hbm_bytes: float        # read and written in HBM per step (ops' own and async copies)
    ops: float              # TensorCore ops (each pays a gap)
    collectives: float
    mxu_s: float            # sums of each part over the ops (the step is not their sum)
    vpu_s: float
    hbm_s: float
    gap_s: float
    collective_s: float
    wait_s: float           # the core waiting at async copies' done
    launch_s: float

    def extrapolate(self, shallow: "XlaCost", missing: int) -> "XlaCost":
        """This (deep) cut plus ``missing`` repetitions of its difference from
        ``shallow``: every figure is a sum over ops, so it scales exactly."""
        return XlaCost(**{f.name: getattr(self, f.name) + missing * (
            getattr(self, f.name) - getattr(shallow, f.name)) for f in dataclasses.fields(self)})


def model(module: Module, target) -> XlaCost:
    c, cal = target.constants, calibration.load()
    bw = target.hbm_bw * c.hbm_efficiency
    defs = module.defs()
    t, pending = c.kernel_launch_s, {}                 # async start name -> bytes left
    sums = dict(hbm_bytes=0.0, ops=0, collectives=0, mxu_s=0.0, vpu_s=0.0, hbm_s=0.0,
                gap_s=0.0, collective_s=0.0, wait_s=0.0)
    for ins in module.instrs():
        op = ins.opcode
        if op in ASYNC:
            dest = ins.type[ASYNC[op]]
            pending[ins.name] = float(dest.nbytes)
            sums["hbm_bytes"] += dest.nbytes
            continue
        if op in ("copy-done", "slice-done") and ins.operands[0] in pending:
            left = pending.pop(ins.operands[0]) / bw
            t, sums["wait_s"] = t + left, sums["wait_s"] + left
            continue
        if op in FREE or op.endswith("-done") or _bookkeeping(ins) or _scalar(ins):
            continue
        if op in ("while", "conditional", "call"):
            raise NotImplementedError(f"the XLA step has a {op} ({ins.name}): its cost is "
                                      "not modeled (the reference step is unrolled)")
        kind = op.removesuffix("-start")
        if kind in COLLECTIVES:
            gap = c.op_overhead_s
            d = _collective(ins, kind, target) + gap
            sums.update(collectives=sums["collectives"] + 1,
                        collective_s=sums["collective_s"] + d - gap, gap_s=sums["gap_s"] + gap)
            busy = 0.0
        else:
            nbytes = _hbm_bytes(module, ins, defs)
            mxu, vpu = _compute(module, ins, defs, target, cal)
            busy = nbytes / bw
            gap = c.op_overhead_s + (c.dma_latency_s if nbytes else 0.0)
            d = max(busy, mxu + vpu) + gap
            sums.update(ops=sums["ops"] + 1, hbm_bytes=sums["hbm_bytes"] + nbytes,
                        mxu_s=sums["mxu_s"] + mxu, vpu_s=sums["vpu_s"] + vpu,
                        hbm_s=sums["hbm_s"] + busy, gap_s=sums["gap_s"] + gap)
        _drain(pending, (d - busy) * bw)           # the HBM path's idle time in this op
        t += d
    return XlaCost(step_s=t, launch_s=c.kernel_launch_s, **sums)


def async_bytes(module: Module) -> float:
    """Bytes the program's async copies move (each copy's destination)."""
    return float(sum(i.type[ASYNC[i.opcode]].nbytes for i in module.instrs()
                     if i.opcode in ASYNC))


def _drain(pending: dict, nbytes: float) -> None:
    """Move ``nbytes`` of the async copies in flight, oldest first."""
    for name in list(pending):
        if nbytes <= 0:
            return
        moved = min(pending[name], nbytes)
        pending[name] -= moved
        nbytes -= moved


def _bookkeeping(ins: Instr) -> bool:
    """Custom calls that only name VMEM buffers together (libtpu's ConcatBitcast)."""
    return ins.opcode == "custom-call" and "ConcatBitcast" in ins.attrs


def _scalar(ins: Instr) -> bool:
    """The scalar unit's: an unfused op whose every result is in SMEM or a
    single element outside VMEM (a fusion is a TensorCore program whatever its
    result: the LM head's matmul and argmax end in one element)."""
    return ins.opcode != "fusion" and all(a.space == SMEM or (a.elems <= 1 and a.space != VMEM)
                                          for a in ins.arrays())


def _group(ins: Instr, cores: int) -> int:
    """Cores in each replica group: mesh['a'=2,'b'=2] {'a','b'}, {{0,1},{2,3}} or [2,4]<=[8]."""
    rg = re.search(r"replica_groups=(mesh\[[^]]*\]\s*\{[^}]*\}|\{\{[^}]*\}|\[[\d,]+\]<=)",
                   ins.attrs)
    if not rg:
        return cores
    text = rg.group(1)
    if text.startswith("mesh"):
        sizes = dict(re.findall(r"'(\w+)'=(\d+)", text))
        chosen = re.findall(r"'(\w+)'", text.split("{", 1)[1])
        return math.prod(int(sizes[a]) for a in chosen)
    if text.startswith("{{"):
        return len(text[2:].split(","))
    return int(re.findall(r"\d+", text)[-1])


def _collective(ins: Instr, kind: str, target) -> float:
    n = _group(ins, target.cores)
    if n <= 1:
        return 0.0
    t = target.with_cores(n)
    out = ins.arrays()[-1] if ins.opcode.endswith("-start") else ins.arrays()[0]
    if kind == "all-reduce":
        return min(phase_seconds(out.nbytes, t), 2 * phase_seconds(out.nbytes // n, t))
    if kind == "all-gather":
        return phase_seconds(out.nbytes // n, t)        # each core's shard to every peer
    if kind in ("reduce-scatter", "collective-permute"):
        return phase_seconds(out.nbytes, t)
    return phase_seconds(out.nbytes // n, t)            # all-to-all


def _calls(ins: Instr) -> str | None:
    m = re.search(r"calls=%([\w.\-]+)", ins.attrs)
    return m.group(1) if m and ins.opcode == "fusion" else None


def _params(module: Module, comp: str) -> dict:
    """Parameter index -> its instruction's name, in fused computation ``comp``."""
    return {int(i.args): i.name for i in module.instrs(comp) if i.opcode == "parameter"}


def _hbm_bytes(module: Module, ins: Instr, defs: dict) -> float:
    """Bytes the op reads and writes in HBM (memory space 0)."""
    comp = _calls(ins)
    root = module.instrs(comp)[-1] if comp else ins
    table = module.defs(comp) if comp else defs
    place = IN_PLACE.get(root.opcode)
    params = _params(module, comp) if comp else {}
    total = 0.0
    for k, name in enumerate(ins.operands):
        arr = defs[name].arrays()[0]
        if arr.space != HBM:
            continue
        if comp:
            total += min(arr.nbytes, _read(module, comp, params[k]))
        elif not (place is not None and k == 0):      # an unfused in-place update
            total += arr.nbytes
    written = sum(a.nbytes for a in ins.arrays() if a.space == HBM)
    if written and place is not None:                 # in place: only the update
        written = table[root.operands[place]].arrays()[0].nbytes
    return total + written


def _read(module: Module, comp: str, name: str, out: float | None = None) -> float:
    """Bytes of value ``name`` of computation ``comp`` its users read: what a
    slice or gather of it takes, nothing for the buffer an in-place update
    writes into, all of it for anything else, followed through views and
    nested fusions; ``out``: what is read of ``comp``'s result, where the
    value reaches it (all of it for the op's own result)."""
    instrs = module.instrs(comp)
    full = next(i for i in instrs if i.name == name).arrays()[0].nbytes
    total = (full if out is None else out) if instrs[-1].name == name else 0.0
    for user in instrs:
        for k, operand in enumerate(user.operands):
            if operand != name:
                continue
            if user.opcode in VIEWS:
                total += _read(module, comp, user.name, out)
            elif user.opcode in SLICES and k == 0:
                total += user.arrays()[0].nbytes
            elif user.opcode in IN_PLACE and k == 0:
                pass
            elif _calls(user):
                inner = _calls(user)
                total += _read(module, inner, _params(module, inner)[k],
                               _read(module, comp, user.name, out))
            else:
                return full
    return min(total, full)


def _compute(module: Module, ins: Instr, defs: dict, target, cal) -> tuple[float, float]:
    """(MXU seconds, VPU seconds) of the op: its matmuls' cycles at the
    calibrated clock, and one VPU op per element of everything else it
    computes (a reduction per element it reads) at ``vpu_f32_ops_per_s``."""
    cycles, elems = 0.0, 0
    for body, table in _bodies(module, ins, defs):
        for i in body:
            if i.opcode in MATMULS:
                cycles += _matmul_cycles(i, table, cal)
            elif i.opcode == "reduce":
                elems += table[i.operands[0]].arrays()[0].elems
            elif i.opcode not in FREE | VIEWS | {"broadcast", "iota", "fusion"}:
                elems += sum(a.elems for a in i.arrays())
    return cycles / cal.rate("clock_hz"), elems / target.constants.vpu_f32_ops_per_s


def _bodies(module: Module, ins: Instr, defs: dict):
    """(instructions, their name table) of the op: its fused computation and
    the fusions nested in it, or the op alone."""
    comp = _calls(ins)
    if comp is None:
        yield [ins], defs
        return
    table = module.defs(comp)
    yield module.instrs(comp), table
    for i in module.instrs(comp):
        if _calls(i):
            yield from _bodies(module, i, table)


def _dims(ins: Instr, key: str) -> list[int]:
    m = re.search(rf"\b{key}=\{{([\d,]*)\}}", ins.attrs)
    return [int(d) for d in m.group(1).split(",") if d] if m else []


def _matmul_cycles(ins: Instr, table: dict, cal) -> float:
    """Cycles of one matmul: its larger operand is pushed into the MXU as
    weights (at decode the other has a few rows), each push at the rate of its
    dtype (f32 at HIGHEST precision its own, much slower rate) and layout
    (contracting its minor dimension: transposed pushes), or its flops where
    those take longer (compiler/floors.py's rule for the core floor)."""
    lhs, rhs = (table[o].arrays()[0] for o in ins.operands[:2])
    out = ins.arrays()[0]
    if ins.opcode == "dot":
        lc, rc = _dims(ins, "lhs_contracting_dims"), _dims(ins, "rhs_contracting_dims")
        macs = out.elems * math.prod(lhs.dims[d] for d in lc)
    else:         # a convolution: each output element sums over rhs's input features and window
        lhs_l, rest = ins.attr("dim_labels").split("_")
        rhs_l = rest.split("->")[0]
        macs = out.elems * rhs.elems / rhs.dims[rhs_l.index("o")]
        lc = [lhs_l.index("f")]
        rc = [j for j, ch in enumerate(rhs_l) if ch != "o"]
    pushed, contracted = (lhs, lc) if lhs.elems > rhs.elems else (rhs, rc)
    transposed = len(pushed.dims) > 1 and pushed.minor_to_major[0] in contracted
    highest = "highest" in (ins.attr("operand_precision") or "")
    key = ("float32_highest" if highest and "f32" in (lhs.dtype, rhs.dtype)
           else DTYPES.get(pushed.dtype, "float32"))
    return max(pushed.elems / _rate(cal, key, transposed, ins.name),
               2.0 * macs / cal.rate("flops_per_cycle"))


def _rate(cal, key: str, transposed: bool, where: str) -> float:
    """Calibrated weights per cycle; a layout the calibration did not measure
    for this dtype (HIGHEST transposed) at half the [K, N] rate, as every
    measured dtype's transposed rate is."""
    name = f"mxu_weights_per_cycle.{key}.{'nk' if transposed else 'kn'}"
    if name in cal.rates:
        return cal.rate(name)
    return cal.weights_per_cycle(key, False, f"xla.{where}") / 2
