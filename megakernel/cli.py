"""The ``megakernel`` command: show, plan, compile, check, aot, demo.

Every subcommand takes MODEL the same way (a zoo name, a JSON card or IR file,
a Hugging Face config.json or checkpoint folder). A project error prints one
paragraph and exits with code 2; ``--debug`` shows the traceback instead.
"""

from __future__ import annotations

import argparse
import os
import sys
import textwrap
import time
from contextlib import contextmanager

from megakernel.errors import MegakernelError

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# Virtual CPU devices for interpret-mode checks; must be set before jax loads.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")


@contextmanager
def progress(label: str):
    """Say what a step is doing when it may take over a second, then its time."""
    print(f"  {label} ...", end="", flush=True, file=sys.stderr)
    t0 = time.perf_counter()
    try:
        yield
    finally:
        print(f" {time.perf_counter() - t0:.1f} s", file=sys.stderr)


def _load(spec: str):
    from megakernel.models import load_model

    return load_model(spec)


def cmd_show(args) -> int:
    from megakernel.models.show import describe

    print(describe(_load(args.model)))
    return 0


def parse_size(text: str) -> int:
    """``48MiB``, ``512KiB``, ``2GiB`` or a plain byte count."""
    units = {"kib": 2**10, "mib": 2**20, "gib": 2**30, "kb": 10**3, "mb": 10**6, "gb": 10**9}
    t = text.strip().lower()
    for unit, scale in units.items():
        if t.endswith(unit):
            return int(float(t[: -len(unit)]) * scale)
    try:
        return int(t)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a size; write e.g. 58MiB, 512KiB or 1048576") from None


def _plan_args(p, *, model_optional: bool = False) -> None:
    _model_arg(p, optional=model_optional)
    p.add_argument("--devices", "-n", type=int, default=1, help="TensorCores (1-32)")
    p.add_argument("--target", default="tpu7x", help="chip: tpu7x, v6e or v5e")
    p.add_argument("--batch", "-b", type=int, default=1, help="sequences per step")
    p.add_argument("--tokens", "-t", type=int, default=1, help="new tokens per sequence per step")
    p.add_argument("--context", type=int, default=None, help="cached tokens the cost model assumes")
    p.add_argument("--layers", type=int, default=None, help="cut the model to its first K layers")
    p.add_argument("--vmem-budget", type=parse_size, default=None,
                   help="VMEM the plan may use per core (default: capacity - 6 MiB)")
    p.add_argument("--bank-bytes", type=parse_size, default=None, help="override ring bank size")
    p.add_argument("--banks", type=int, default=None, help="override ring bank count")
    p.add_argument("--expert-slots", type=int, default=None, help="override MoE expert slots")
    p.add_argument("--kv-tile", type=int, default=None, help="override KV tile (tokens)")
    p.add_argument("--moe-parallel", default=None,
                   help="tp, ep, or an expert-parallel degree")


def make_plan(args, model=None):
    """(model, plan) for a command's MODEL and planning flags."""
    from megakernel.compiler.pipeline import plan_model
    from megakernel.compiler.target import make_target

    model = model or _load(args.model)
    if args.layers:
        model = model.truncated(args.layers)
    target = make_target(args.target, args.devices)
    if args.vmem_budget is not None:
        target = make_target(args.target, args.devices,
                             vmem_reserve=max(target.vmem_bytes - args.vmem_budget, 0))
    moe_parallel = args.moe_parallel
    if moe_parallel is not None and moe_parallel.isdigit():
        moe_parallel = int(moe_parallel)
    overrides = {k: v for k, v in dict(
        bank_bytes=args.bank_bytes, num_banks=args.banks, expert_slots=args.expert_slots,
        kv_tile=args.kv_tile, moe_parallel=moe_parallel).items() if v is not None}
    with progress(f"planning {model.name} on {args.devices} core(s)"):
        plan = plan_model(model, target=target, devices=args.devices, batch=args.batch,
                          tokens=args.tokens, context=args.context, overrides=overrides)
    return model, plan


def cmd_plan(args) -> int:
    from megakernel.compiler import report

    _, plan = make_plan(args)
    print(plan.to_json(indent=1) if args.json else report.terminal(plan))
    return 0


def _plan_json_args(p) -> None:
    _plan_args(p)
    p.add_argument("--json", action="store_true", help="print the plan as JSON")


def write_compiled(model, plan, out_dir: str) -> str:
    """Write kernel.py, plan.json, plan.md and model.json into ``out_dir``
    atomically: all of them, or (on any failure) nothing."""
    import shutil
    import tempfile
    from pathlib import Path

    from megakernel.backends.pallas_tpu import compile_model
    from megakernel.compiler import report
    from megakernel.ir.serialize import model_to_json

    out = Path(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        with progress("generating kernel.py"):
            compile_model(model, plan, tmp)
        (tmp / "plan.json").write_text(plan.to_json(indent=1))
        (tmp / "plan.md").write_text(report.markdown(plan))
        (tmp / "model.json").write_text(model_to_json(model))
        (tmp / "request.json").write_text(_request_json(plan))
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    return str(out)


def _request_json(plan) -> str:
    import json

    r = plan.request
    return json.dumps({"devices": r.devices, "batch": r.batch, "tokens": r.tokens,
                       "context": r.context, "target": plan.target.chip}, indent=1)


def load_compiled(out_dir: str):
    """(model, plan) of a directory written by ``megakernel compile``."""
    import json
    from pathlib import Path

    from megakernel.compiler.pipeline import plan_model
    from megakernel.errors import EmitError
    from megakernel.ir.serialize import model_from_json

    d = Path(out_dir)
    for name in ("kernel.py", "model.json", "request.json", "plan.json"):
        if not (d / name).is_file():
            raise EmitError(f"{d} has no {name}; write it with `megakernel compile MODEL -o {d}`",
                            path=str(d))
    model = model_from_json((d / "model.json").read_text())
    req = json.loads((d / "request.json").read_text())
    plan = plan_model(model, target=req["target"], devices=req["devices"], batch=req["batch"],
                      tokens=req["tokens"], context=req["context"])
    saved = json.loads((d / "plan.json").read_text())
    if plan.to_dict() != saved:
        raise EmitError(f"{d}/plan.json no longer matches what the planner produces for "
                        "model.json; recompile the directory", path=str(d))
    return model, plan


def check_line(result) -> str:
    """One readable line for a CheckResult."""
    verdict = "PASS" if result.ok else "FAIL"
    return (f"{verdict}: {result.steps} step(s), tokens agree {result.token_agreement:.0%}, "
            f"max |logits - reference| {result.max_abs_err:.2e} (tolerance "
            f"{result.tolerance:.2e}), max cache error {result.cache_max_err:.2e}, "
            f"races {'FOUND' if result.races else 'none'}, {result.seconds:.1f} s")


def aot_line(result) -> str:
    return result.summary() if hasattr(result, "summary") else str(result)


def cmd_compile(args) -> int:
    model, plan = make_plan(args)
    out = write_compiled(model, plan, args.output)
    print(f"wrote {out}/kernel.py, plan.json, plan.md (plan {plan.digest()})")
    return 0


def _compile_args(p) -> None:
    _plan_args(p)
    p.add_argument("--output", "-o", required=True, help="directory to write")


def cmd_check(args) -> int:
    from pathlib import Path

    from megakernel.backends.pallas_tpu import check

    if args.examples:
        return _check_examples(args)
    if args.hf:
        from megakernel.testing import check_hf_fixture

        with progress(f"decoding the HF fixture {args.hf} through the kernel"):
            errors = check_hf_fixture(args.hf, devices=args.devices)
        for step, err in errors:
            print(f"{step:10s} max |kernel - HF| = {err:.2e} of the logit scale")
        return 0 if all(err <= 1e-4 for _, err in errors) else 1
    if Path(args.model).is_dir() and (Path(args.model) / "kernel.py").exists():
        model, plan = load_compiled(args.model)
    else:
        model, plan = make_plan(args)
    _fits_interpreter(model, args.max_weights_gib)
    from megakernel.models.weights import init_weights

    with progress(f"interpret-mode check, {args.steps} step(s)"):
        result = check(model, plan, init_weights(model, args.seed), steps=args.steps,
                       seed=args.seed)
    print(check_line(result))
    return 0 if result.ok else 1


def _check_examples(args) -> int:
    from megakernel.testing import check_examples

    model = _load(args.model)
    if args.layers:
        model = model.truncated(args.layers)
    _fits_interpreter(model, args.max_weights_gib)
    with progress(f"{args.examples} drawn cases on {args.devices} core(s)"):
        report_text = check_examples(model, examples=args.examples, devices=args.devices)
    print(report_text)   # a failure raises CheckError: the shrunk case, exit 2
    return 0


def _fits_interpreter(model, limit_gib: float) -> None:
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


def _check_args(p) -> None:
    _plan_args(p)
    p.add_argument("--steps", type=int, default=2, help="decode steps to check")
    p.add_argument("--seed", type=int, default=0, help="weights and token seed")
    p.add_argument("--hf", default=None, help="check against a Hugging Face fixture folder")
    p.add_argument("--examples", type=int, default=0,
                   help="property-test N drawn cases (batch, tokens, positions, ids)")
    p.add_argument("--max-weights-gib", type=float, default=2.0,
                   help="refuse models with more weight bytes than this (interpret mode "
                        "runs on the CPU)")


def cmd_aot(args) -> int:
    from megakernel.backends.pallas_tpu import aot_compile

    _, plan = load_compiled(args.dir)
    with progress(f"compiling for {args.topology} with libtpu"):
        result = aot_compile(args.dir, plan, topology=args.topology)
    print(aot_line(result))
    return 0


def _aot_args(p) -> None:
    p.add_argument("dir", help="a directory written by `megakernel compile`")
    p.add_argument("--topology", default="tpu7x:2x2x1", help="TPU topology, e.g. tpu7x:2x2x1")


def cmd_demo(args) -> int:
    """The main job on the default model: plan, emit, check, AOT-compile."""
    import tempfile

    from megakernel.backends.pallas_tpu import aot_compile, check
    from megakernel.compiler import report
    from megakernel.models.weights import init_weights

    args.model = args.model or "tiny-moe"
    model = _load(args.model)
    print(f"model {model.name}: {len(model.layers)} layers in {len(model.stacks)} stack(s), "
          f"{model.param_count:,} parameters")
    _, plan = make_plan(args, model)
    out = write_compiled(model, plan, args.output or tempfile.mkdtemp(prefix="megakernel-demo-"))
    print(f"kernel: {out}/kernel.py")
    with progress(f"interpret-mode check on {args.devices} virtual devices"):
        result = check(model, plan, init_weights(model, 0), steps=args.steps, seed=0)
    print(check_line(result))
    with progress("AOT compile for TPU7x"):
        aot = aot_compile(out, plan, topology=args.topology)
    print(aot_line(aot))
    print(report.terminal(plan, buffers=False))
    return 0 if result.ok else 1


def _demo_args(p) -> None:
    _plan_args(p, model_optional=True)
    p.set_defaults(devices=4)
    p.add_argument("--output", "-o", default=None, help="where to write the kernel")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--topology", default="tpu7x:2x2x1")


COMMANDS = {
    "show": (cmd_show, "print layers, stacks, shapes, parameter count and bytes",
             ["megakernel show tiny-moe", "megakernel show path/to/config.json"]),
    "plan": (cmd_plan, "print the plan report: buffers, VMEM, ring, collectives, modeled time",
             ["megakernel plan qwen3-32b --devices 8",
              "megakernel plan tiny-moe --devices 4 --batch 8 --vmem-budget 40MiB"]),
    "compile": (cmd_compile, "write DIR/kernel.py, plan.json and plan.md (all or nothing)",
                ["megakernel compile tiny-moe --devices 4 -o out/tiny-moe",
                 "megakernel compile qwen3-32b --devices 8 -o out/qwen3-32b"]),
    "check": (cmd_check, "run the kernel in interpret mode against the reference",
              ["megakernel check tiny-moe --devices 2 --steps 3",
               "megakernel check out/tiny-moe",
               "megakernel check tiny-moe --examples 10 --layers 2",
               "megakernel check tests/fixtures/hf/qwen3 --hf tests/fixtures/hf/qwen3"]),
    "aot": (cmd_aot, "compile a kernel directory for TPU with libtpu; VMEM used vs plan",
            ["megakernel aot out/qwen3-32b --topology tpu7x:2x2x1"]),
    "demo": (cmd_demo, "plan, emit, check and AOT-compile the default model (tiny-moe)",
             ["megakernel demo", "megakernel demo qwen3-8b --layers 2 --devices 4"]),
}


def _examples(lines: list[str]) -> str:
    return "examples:\n" + "\n".join(f"  {line}" for line in lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="megakernel",
        description="Compile an LLM layer graph into one Pallas TPU decode-step kernel.",
        epilog=_examples([ex for _, _, exs in COMMANDS.values() for ex in exs[:1]]),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (fn, help_text, examples) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text,
                           epilog=_examples(examples),
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        # SUPPRESS: `megakernel --debug plan ...` and `megakernel plan --debug ...` both work.
        p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                       help="show tracebacks on errors")
        ADD_ARGS.get(name, _model_arg)(p)
        p.set_defaults(fn=fn)
    return parser


def _model_arg(p, *, optional: bool = False):
    p.add_argument("model", nargs="?" if optional else None, default=None,
                   help="zoo name, JSON card/IR file, HF config.json or checkpoint dir")


ADD_ARGS: dict = {"plan": _plan_json_args, "compile": _compile_args, "check": _check_args,
                  "aot": _aot_args, "demo": _demo_args}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.fn(args)
    except MegakernelError as err:
        if args.debug:
            raise
        print(textwrap.fill(f"error: {err}", width=88), file=sys.stderr)
        return 2
    except (FileNotFoundError, IsADirectoryError, PermissionError) as err:
        if args.debug:
            raise
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
