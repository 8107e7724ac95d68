"""The CLI's arguments: argparse types, the planning flags, and the plan they ask for.

A bad value fails in argparse, before any model is loaded: one line naming the
flag, the value found and what is accepted, exit code 2, no traceback. Values
that need the model or the target (``--layers``, ``--vmem-budget``,
``--topology`` against a plan) are checked next, each a named error.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import re
import sys
import time
from contextlib import contextmanager
from decimal import Decimal

from megakernel.chips import TOPOLOGIES, check_topology  # noqa: F401 - the CLI's names

_SIZE = re.compile(r"(\d{1,15}(?:\.\d{1,9})?)\s*([kmg]i?b)?", re.I)
_UNITS = {"kib": 2**10, "mib": 2**20, "gib": 2**30, "kb": 10**3, "mb": 10**6, "gb": 10**9}


def _shown(text: str) -> str:
    return repr(text if len(text) <= 40 else text[:40] + "...")


def id_list(text: str) -> list[int]:
    """An argparse type: comma-separated non-negative token ids, e.g. 1,2,3."""
    parts = text.split(",")
    if len(parts) > 100_000 or not all(p.strip().isdigit() and len(p.strip()) < 12
                                       for p in parts):
        raise argparse.ArgumentTypeError(f"{_shown(text)} is not a list of token ids; give "
                                         "comma-separated non-negative integers, e.g. 1,2,3")
    return [int(p) for p in parts]


def steps_per_call(text: str) -> "int | str":
    """An argparse type: "auto" (the planner chooses) or an integer in 1..128."""
    from megakernel.compiler.choose_steps import AUTO
    from megakernel.compiler.request import MAX_STEPS_PER_CALL

    if text == AUTO:
        return AUTO
    try:
        return int_in(1, MAX_STEPS_PER_CALL)(text)
    except argparse.ArgumentTypeError as err:
        raise argparse.ArgumentTypeError(f"{err}, or auto") from None


def int_in(low: int, high: int | None = None):
    """An argparse type: an integer in [low, high] (no upper bound if None)."""
    span = f"in {low}..{high}" if high is not None else f">= {low}"

    def parse(text: str) -> int:
        try:
            value = int(text)   # also refuses digit strings too long to be a number
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{_shown(text)} is not an integer; give an integer {span}") from None
        if value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"{value} is out of range; give an integer {span}")
        return value

    return parse


def devices(text: str) -> int:
    from megakernel.compiler.target import MAX_CORES

    return int_in(1, MAX_CORES)(text)


def parse_size(text: str) -> int:
    """``48MiB``, ``512KiB``, ``2GiB``, ``1.5MB`` or a plain byte count: a whole,
    positive number of bytes (no inf, nan, sign or exponent)."""
    m = _SIZE.fullmatch(text.strip())
    if not m:
        raise argparse.ArgumentTypeError(
            f"{_shown(text)} is not a size; write e.g. 58MiB, 512KiB, 1.5GB or 1048576")
    nbytes = Decimal(m.group(1)) * _UNITS.get((m.group(2) or "").lower(), 1)
    if nbytes < 1 or nbytes != int(nbytes):
        raise argparse.ArgumentTypeError(
            f"{_shown(text)} is {nbytes} bytes; give a whole number of bytes, at least 1")
    return int(nbytes)


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"{_shown(text)} is not a positive, finite number")
    return value


def moe_parallel(text: str) -> str | int:
    """``tp``, ``ep``, or an expert-parallel degree >= 1."""
    if text in ("tp", "ep"):
        return text
    try:
        return int_in(1)(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"{_shown(text)}: give tp, ep, or an expert-parallel degree >= 1") from None


def topology(text: str) -> str:
    if text not in TOPOLOGIES:
        raise argparse.ArgumentTypeError(
            f"{_shown(text)} is not a topology this project compiles for; known: "
            + ", ".join(TOPOLOGIES))
    return text


@contextmanager
def progress(label: str):
    """Say what a step is doing when it may take over a second, then its time."""
    from megakernel.cli import interrupts

    interrupts.line_open(True)   # first: an interrupt may land inside the print
    print(f"  {label} ...", end="", flush=True, file=sys.stderr)
    t0 = time.perf_counter()
    try:
        yield
    finally:
        if interrupts.line_open(False):      # not ended by an interrupt's message
            print(f" {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    interrupts.checkpoint()   # each step ends where an interrupt is honoured


def load(spec: str):
    from megakernel.models import load_model

    return load_model(spec)


# Planning flags, by destination: a compiled folder fixes them all (request.json).
PLAN_FLAGS = ("devices", "target", "batch", "tokens", "context", "layers", "vmem_budget",
              "bank_bytes", "banks", "expert_slots", "kv_tile", "moe_parallel", "steps_per_call",
              "quantize")


def plan_args(p, *, model_optional: bool = False) -> None:
    positive = int_in(1)
    model_arg(p, optional=model_optional)
    p.add_argument("--devices", "-n", type=devices, default=1,
                   help="TensorCores (1-32)")
    p.add_argument("--target", default="tpu7x", help="chip: tpu7x, v6e or v5e")
    p.add_argument("--batch", "-b", type=positive, default=1, help="sequences per step")
    p.add_argument("--tokens", "-t", type=positive, default=1,
                   help="new tokens per sequence per step")
    # Not --steps: `check --steps` counts the steps a check runs.
    p.add_argument("--steps-per-call", type=steps_per_call, default="auto", metavar="auto|N",
                   help="greedy decode steps one kernel call runs (tokens fed back "
                        "inside the kernel; needs --tokens 1). Default auto: the "
                        "planner's choice (its rule and N in the report); check and "
                        "demo default to 1")
    p.add_argument("--context", type=positive, default=None,
                   help="cached tokens the cost model assumes")
    p.add_argument("--layers", type=positive, default=None,
                   help="cut the model to its first K layers")
    p.add_argument("--vmem-budget", type=parse_size, default=None,
                   help="VMEM the plan may use per core (default: capacity - 6 MiB)")
    p.add_argument("--bank-bytes", type=parse_size, default=None,
                   help="override ring bank size")
    p.add_argument("--banks", type=positive, default=None, help="override ring bank count")
    p.add_argument("--expert-slots", type=positive, default=None,
                   help="override MoE expert slots")
    p.add_argument("--kv-tile", type=positive, default=None, help="override KV tile (tokens)")
    p.add_argument("--moe-parallel", type=moe_parallel, default=None,
                   help="tp, ep, or an expert-parallel degree")
    p.add_argument("--allreduce", choices=("one_shot", "rs_ag"), default=None,
                   help="override every all-reduce's algorithm")
    p.add_argument("--allreduce-wide", choices=("one_shot", "rs_ag"), default=None,
                   help="override the algorithm of the all-reduces wider than the hidden "
                        "size (a per-slot MoE's picks) alone")
    p.add_argument("--wire", choices=("bfloat16", "float32"), default=None,
                   help="dtype the all-reduces' partials travel in")
    p.add_argument("--expert-rows", type=positive, default=None,
                   help="rows whose routed experts the cost model counts as distinct "
                        "(default: every row; 1: rows that route alike)")
    p.add_argument("--quantize", action="append", default=None, metavar="KIND=FORMAT",
                   help="store a weight kind (dense, or experts of a MoE model) in a "
                        "format (int8, int4_g32/64/128, fp8_b128, mxfp4, nvfp4), rounded to "
                        "nearest on load; repeatable, each kind once; over the card's own "
                        "quantize table")


def with_quantize(model, pairs: list[str] | None):
    """``model`` with the ``--quantize`` pairs over its card's quantize table."""
    import dataclasses

    from megakernel.ir.weight_kinds import Quantize

    if not pairs:
        return model
    table = {**model.quantize.chosen(), **Quantize.parse(pairs, model=model).chosen()}
    return dataclasses.replace(model, quantize=Quantize(**table))


def cut_layers(model, layers: int | None):
    """``model`` cut to its first ``layers`` layers (``--layers``), if given."""
    from megakernel.errors import IRError

    if layers is None:
        return model
    if layers > len(model.layers):
        raise IRError(f"{layers} is more than the {len(model.layers)} layers {model.name} has",
                      path="--layers",
                      hint=f"give --layers 1..{len(model.layers)}, or leave it out")
    return model.truncated(layers)


def make_plan(args, model=None):
    """(model, plan) for a command's MODEL and planning flags."""
    from megakernel.compiler.pipeline import plan_model
    from megakernel.compiler.target import make_target
    from megakernel.errors import PlanningError

    loaded = model is None
    model = with_quantize(cut_layers(model or load(args.model), args.layers),
                          getattr(args, "quantize", None))
    target = make_target(args.target, args.devices)
    if args.vmem_budget is not None:
        if args.vmem_budget > target.vmem_bytes:
            raise PlanningError(
                f"{args.vmem_budget / 2**20:.1f} MiB is more than the "
                f"{target.vmem_bytes / 2**20:.0f} MiB of VMEM a {args.target} TensorCore has",
                path="--vmem-budget", hint=f"give at most {target.vmem_bytes // 2**20}MiB")
        target = make_target(args.target, args.devices,
                             vmem_reserve=target.vmem_bytes - args.vmem_budget)
    overrides = {k: v for k, v in dict(
        bank_bytes=args.bank_bytes, num_banks=args.banks, expert_slots=args.expert_slots,
        kv_tile=args.kv_tile, moe_parallel=args.moe_parallel, allreduce=args.allreduce,
        allreduce_wide=args.allreduce_wide, wire=args.wire, expert_rows=args.expert_rows).items() if v is not None}
    with progress(f"planning {model.name} on {args.devices} core(s)"):
        plan = plan_model(model, target=target, devices=args.devices, batch=args.batch,
                          tokens=args.tokens, context=args.context, overrides=overrides,
                          steps=args.steps_per_call)
    if not loaded:
        return model, plan
    from megakernel.models.load import shipped_notes

    # A pre-quantized checkpoint's kinds that load dequantized, said once.
    notes = tuple(("shipped formats", n) for n in shipped_notes(args.model))
    return model, dataclasses.replace(plan, choices=plan.choices + notes) if notes else plan


def model_arg(p, *, optional: bool = False):
    p.add_argument("model", nargs="?" if optional else None, default=None,
                   help="zoo name, JSON card/IR file, HF config.json or checkpoint dir")


def fits_interpreter(model, limit_gib: float) -> None:
    """Interpret mode holds random weights in host memory and runs every op in
    the CPU interpreter: refuse models that would take hours or the machine's
    memory, and say what to do instead."""
    from megakernel.errors import CheckError

    nbytes = sum(spec.nbytes for spec in model.params().values())
    if nbytes <= limit_gib * 2**30:
        return
    raise CheckError(
        f"{model.name} has {nbytes / 2**30:.1f} GiB of weights ({len(model.layers)} layers); "
        f"an interpret-mode check is limited to {limit_gib:g} GiB (--max-weights-gib), since "
        "it holds random weights in host memory and interprets every op on the CPU",
        path=f"{model.name}.check",
        hint="check a model of the same family at a small width (see docs/new-model.md), "
             "cut layers with --layers K (the embedding and LM head stay full size), or "
             "run `megakernel aot` on the full-size kernel: it compiles it for TPU")
