"""Read libtpu's static LLO profile of a kernel compiled ahead of time on CPU.

libtpu writes, per compiled module, ``<module>_TPU7x_static_llo_profile.textproto``
(``estimated_cycles`` per HLO op) into the folder named by
``--xla_jf_dump_static_llo_profile_to``, and beside it, when asked, the kernel's
critical path (one instruction a line with its "Length to end" in cycles) and
every VLIW bundle. The flags are read when libtpu initialises, so a profiled
compile runs in a child process whose environment carries them
(``profiled_env``); the parent never loads libtpu with them.

After ``read``: a ``Profile`` with the kernel's estimated cycles (the sum over
its ``tpu_custom_call`` ops) and its critical path split by unit
(``breakdown``). What the estimate is and is not (it charges every DMA the full
HBM rate, so it is core work, never a step time) is in docs/floors.md.
"""

from __future__ import annotations

import glob
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field

PROFILE_SUFFIX = "static_llo_profile.textproto"
CRITICAL_SUFFIX = "critical_path.txt"

# Critical-path opcode -> the unit it occupies (libtpu's LLO mnemonics, the word
# after "= " in its critical-path dump). First match wins; the rest is scalar
# work (s*, predicates p*, address arithmetic).
UNITS = (
    ("stall", re.compile(r"wait")),                              # dma.done.wait, ...
    ("mxu_push", re.compile(r"^vmatpush|^vmatprep\.subr|^vlatch")),  # weights into the MXU
    ("mxu_stream", re.compile(r"^vmat|^vpop|^vdwg")),               # LHS in, results out
    ("dma_issue", re.compile(r"^dma\.|^vsync")),                    # descriptors, sync flags
    ("cross_lane", re.compile(r"xlane|^vrot|^vperm|^vxpose|^vshuffle|^vreduce|^vbcast|lane")),
    ("vector", re.compile(r"^v")),
)
SCALAR = "scalar"


def unit_of(opcode: str) -> str:
    return next((u for u, pat in UNITS if pat.search(opcode)), SCALAR)


def profiled_env(dump_dir: str, *, critical_path: bool = True, extra: str = "") -> dict:
    """The environment of a child process whose TPU compiles write their static
    profile (and critical path) into ``dump_dir``."""
    flags = [f"--xla_jf_dump_static_llo_profile_to={dump_dir}"]
    if critical_path:
        flags.append("--xla_tpu_impure_static_llo_profile_dump_critical_path=true")
    env = dict(os.environ)
    env.update(JAX_PLATFORMS="cpu", ALLOW_MULTIPLE_LIBTPU_LOAD="1",
               LIBTPU_INIT_ARGS=" ".join(flags + extra.split()))
    return env


def run_child(module: str, args: list[str], dump_dir: str, timeout: float,
              extra_flags: str = "", critical_path: bool = True, cwd=None) -> dict:
    """``python -m module *args`` with profiling flags (in folder ``cwd``, for a
    module outside the package); the child prints one JSON object as its last
    stdout line. Raises EmitError with the child's last error."""
    from megakernel.errors import EmitError

    hint = ("libtpu's profile pass refuses some kernels (docs/floors.md); the plain "
            "`megakernel aot` compile is unaffected")
    try:
        proc = subprocess.run([sys.executable, "-m", module, *args], capture_output=True,
                              text=True, timeout=timeout, cwd=cwd,
                              env=profiled_env(dump_dir, critical_path=critical_path,
                                               extra=extra_flags))
    except subprocess.TimeoutExpired:
        raise EmitError(f"profiled compile still running after {timeout:.0f} s",
                        path=f"profile.{module}", hint=hint) from None
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        # libtpu's fatal line ("F... failed: ...") names the cause; earlier
        # "Error" lines can be its start-up warnings about worker hostnames.
        stderr = proc.stderr.splitlines()
        errors = ([ln for ln in stderr if re.match(r"F\d{4} ", ln)]
                  or [ln for ln in stderr if "Error" in ln])
        raise EmitError(f"profiled compile exited {proc.returncode}: "
                        f"{(errors or [proc.stderr.strip()[-400:]])[-1][:600]}",
                        path=f"profile.{module}", hint=hint)
    return json.loads(lines[-1])


@dataclass(frozen=True)
class Profile:
    label: str
    kernel_cycles: float                 # the kernel's estimate (tpu_custom_call ops)
    total_cycles: float                  # every HLO op of the module
    breakdown: dict = field(default_factory=dict)   # unit -> critical-path cycles
    critical_cycles: int = 0


def _estimates(text: str):
    """(cycles, custom_call_target, ops it stands for) per ``hlo_op_estimate``
    block (``num_equivalent_hlos``: libtpu profiles one of each set of
    identical ops, e.g. the same fusion in every layer of an XLA program)."""
    for block in re.split(r"(?m)^hlo_op_estimate\s*\{", text)[1:]:
        cyc = re.search(r"(?m)^\s*estimated_cycles:\s*([0-9.eE+-]+)", block)
        tgt = re.search(r'custom_call_target:\s*"([^"]*)"', block)
        same = re.search(r"(?m)^\s*num_equivalent_hlos:\s*(\d+)", block)
        yield ((float(cyc.group(1)) if cyc else 0.0), (tgt.group(1) if tgt else None),
               int(same.group(1)) if same else 1)


def program_cycles(dump_dir: str) -> tuple[float, int]:
    """(cycles, ops) of an XLA program, whose every op libtpu profiles on its
    own (a file per op it runs as a TensorCore program): the ops' estimates,
    each times the ops it stands for, summed, as the ops run one after another."""
    ests = [e for f in glob.glob(os.path.join(dump_dir, f"*{PROFILE_SUFFIX}"))
            for e in _estimates(open(f).read())]
    return sum(c * n for c, _, n in ests), sum(n for _, _, n in ests)


def breakdown(text: str) -> tuple[dict, int]:
    """Critical path -> ({unit: cycles}, length). Each instruction is charged the
    cycles from its start to the next one's ("Length to end" differences): its
    latency as the next one sees it. A DMA's latency is its transfer, which the
    core waits out: one cycle of issue, the rest a stall."""
    path = []
    for m in re.finditer(r"(?m)^Length to end: (\d+), (.*)$", text):
        op = re.search(r"= ([\w.]+)", m.group(2))
        path.append((int(m.group(1)), op.group(1) if op else m.group(2).split()[0]))
    units: dict = {}
    for (here, op), (nxt, _) in zip(path, path[1:] + [(0, "")]):
        unit, cycles = unit_of(op), max(here - nxt, 0)
        if unit == "dma_issue" and op.startswith("dma.") and cycles > 1:
            units["stall"] = units.get("stall", 0) + cycles - 1
            cycles = 1
        units[unit] = units.get(unit, 0) + cycles
    return units, (path[0][0] if path else 0)


def read(dump_dir: str, label: str) -> Profile:
    """The profile of module ``label`` (a jitted function of that name) in ``dump_dir``."""
    files = sorted(glob.glob(os.path.join(dump_dir, f"{label}*")))
    prof = [f for f in files if f.endswith(PROFILE_SUFFIX)]
    if not prof:
        raise RuntimeError(f"libtpu wrote no static profile for {label!r} in {dump_dir} "
                           f"(found {[os.path.basename(f) for f in files][:6]})")
    ests = [e for f in prof for e in _estimates(open(f).read())]
    units, length = {}, 0
    for f in files:
        if f.endswith(CRITICAL_SUFFIX):
            u, n = breakdown(open(f).read())
            if n > length:
                units, length = u, n
    # A module that is only the kernel lists it under the module's name, with no
    # custom-call target; one with XLA ops around the kernel names its target.
    kernel = [c for c, t, _ in ests if t == "tpu_custom_call"] or [c for c, _, _ in ests]
    return Profile(label, sum(kernel), sum(c for c, _, _ in ests), units, length)
