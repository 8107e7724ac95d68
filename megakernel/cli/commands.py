"""The ``megakernel`` command: show, plan, compile, check, aot, generate, demo.

Every subcommand takes MODEL the same way (a zoo name, a JSON card or IR file,
a Hugging Face config.json or checkpoint folder); ``check`` and ``aot`` also take
a folder written by ``compile`` (see ``megakernel.cli.artifact``). A project error,
a bad argument or an unusable path prints one paragraph and exits with code 2;
Ctrl-C or SIGTERM prints one line and exits 130 or 143, leaving no partial
output; ``--debug`` shows the traceback instead. A reader that stops reading
(``| head``) ends it quietly with 141, as SIGPIPE ends a Unix tool.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import textwrap

from megakernel.cli import args as cli_args
from megakernel.cli import interrupts
from megakernel.cli.calibrate import _calibrate_args, cmd_calibrate
from megakernel.cli.generate import _generate_args, cmd_generate
from megakernel.cli.listing import cmd_list, list_args, show_args
from megakernel.errors import MegakernelError

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# Virtual CPU devices for interpret-mode checks; must be set before jax loads.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")


def cmd_show(args) -> int:
    from megakernel.models.show import describe

    print(describe(cli_args.cut_layers(cli_args.load(args.model), args.layers)))
    return 0


def cmd_plan(args) -> int:
    from megakernel.compiler import report

    _, plan = cli_args.make_plan(args)
    print(plan.to_json(indent=1) if args.json else report.terminal(plan))
    return 0


def _plan_json_args(p) -> None:
    cli_args.plan_args(p)
    p.add_argument("--json", action="store_true", help="print the plan as JSON")


def compile_into(out_dir: str, args, model=None):
    """Plan, then write the compiled folder ``out_dir`` (``megakernel.cli.artifact``)
    whole or not at all, replacing only a previous compile output -> (model, plan).

    The path is checked, and its temporary sibling made, before planning: a
    refused path costs nothing, and an interrupt at any point removes the sibling."""
    from megakernel.cli import artifact
    from megakernel.cli import outdir

    with outdir.staged(out_dir, artifact.previous_files) as tmp:
        model, plan = cli_args.make_plan(args, model)
        with cli_args.progress("generating kernel.py"):
            artifact.write(tmp, model, plan)
    return model, plan


def check_line(result) -> str:
    """One readable line for a CheckResult."""
    verdict = "PASS" if result.ok else "FAIL"
    ties = result.near_ties
    tied = f" (the rest {ties} near-tie(s) within the logit error)" if ties else ""
    if result.route_ties:
        tied += (f"; {result.route_ties} sequence(s) not compared: the reference routes "
                 f"them by a margin rounding can flip")
    b = result.bounds
    logits = (f" = {b.logits:.2e} x (1 + {result.logit_scale:.3g}, the largest |reference "
              f"logit|)" if b else "")
    state = (f" = {b.state:.2e} x (1 + {result.cache_scale:.3g}, the largest |reference "
             f"state value|)" if b else "")
    return (f"{verdict}: {result.steps} step(s), tokens agree {result.token_agreement:.0%}{tied}, "
            f"max |logits - reference| {result.max_abs_err:.2e} (tolerance "
            f"{result.tolerance:.2e}{logits}), max cache error {result.cache_max_err:.2e} "
            f"(tolerance {result.cache_tolerance:.2e}{state}), "
            f"races {'FOUND' if result.races else 'none'}, {result.seconds:.1f} s")


def aot_line(result) -> str:
    return result.summary() if hasattr(result, "summary") else str(result)


def cmd_compile(args) -> int:
    _, plan = compile_into(args.output, args)
    print(f"wrote {args.output}/kernel.py, plan.json, plan.md, manifest.json "
          f"(plan {plan.digest()})")
    return 0


def _compile_args(p) -> None:
    cli_args.plan_args(p)
    p.add_argument("--output", "-o", required=True, help="directory to write")


def open_compiled(args, folder: str):
    """(model, plan, module) of a compiled folder, verified unless --trust-edited."""
    from megakernel.cli import artifact
    from megakernel.errors import CheckError

    given = [name for name in cli_args.PLAN_FLAGS
             if getattr(args, name, None) != args.subparser.get_default(name)]
    if given:
        flag = "--" + given[0].replace("_", "-")
        raise CheckError(f"{flag} does not apply to a compiled folder: its request.json and "
                         "plan.json fix how it was planned", path=folder,
                         hint=f"compile again with {flag}, or leave it out")
    compiled = artifact.open_compiled(folder, trust_edited=args.trust_edited)
    if compiled.edited:
        print(f"  --trust-edited: using {', '.join(compiled.edited)} as edited, not as "
              "compile wrote it", file=sys.stderr)
    return compiled.model, compiled.plan, compiled.import_kernel()


def cmd_check(args) -> int:
    from megakernel.cli.artifact import is_compiled
    from megakernel.backends.pallas_tpu.check.kernel_check import check, check_positions
    from megakernel.errors import CheckError

    module = None
    if is_compiled(args.model):
        if args.examples or args.hf:
            raise CheckError(f"--{'examples' if args.examples else 'hf'} checks a MODEL, not a "
                             "compiled folder", path=args.model,
                             hint="give the model the folder was compiled from")
        model, plan, module = open_compiled(args, args.model)
    elif args.trust_edited:
        raise CheckError("--trust-edited applies to a folder written by `megakernel compile`",
                         path=args.model, hint="give the compiled folder, or leave it out")
    elif args.examples:
        return _check_examples(args)
    elif args.hf:
        from megakernel.cli.check_hf import check_hf

        return check_hf(args)
    else:
        model, plan = cli_args.make_plan(args)
    cli_args.fits_interpreter(model, args.max_weights_gib)
    from megakernel.models.weights import init_weights

    if plan.request.steps > 1 and args.steps != args.subparser.get_default("steps"):
        raise CheckError(f"--steps {args.steps} counts one-step calls; this kernel runs "
                         f"{plan.request.steps} steps per call and is checked over one call",
                         path="--steps", hint="leave --steps out for a --steps-per-call kernel")
    check_positions(model, plan, args.steps)     # refused before the check starts
    what = (f"{plan.request.steps} steps in one call" if plan.request.steps > 1
            else f"{args.steps} step(s)")
    with cli_args.progress(f"interpret-mode check, {what}"):
        result = check(model, plan, init_weights(model, args.seed), steps=args.steps,
                       seed=args.seed, module=module)
    print(check_line(result))
    return 0 if result.ok else 1


def _check_examples(args) -> int:
    # Looked up in its module when called (tests inject a kernel fault there).
    from megakernel.testing.properties import check_examples

    model = cli_args.cut_layers(cli_args.load(args.model), args.layers)
    cli_args.fits_interpreter(model, args.max_weights_gib)
    with cli_args.progress(f"{args.examples} drawn cases on {args.devices} core(s)"):
        report_text = check_examples(model, examples=args.examples, devices=args.devices,
                                     seed=args.seed)
    print(report_text)   # a failure raises CheckError: the shrunk case, exit 2
    return 0


def _trust_edited_arg(p) -> None:
    p.add_argument("--trust-edited", action="store_true",
                   help="use a compiled folder's files as they are now, even where they "
                        "differ from what compile wrote (its manifest's digests)")


def _check_args(p) -> None:
    cli_args.plan_args(p)
    # A check compares single steps with the reference unless asked for a
    # several-step kernel (then it checks one call of it).
    p.set_defaults(steps_per_call=1)
    _trust_edited_arg(p)
    p.add_argument("--steps", type=cli_args.int_in(1), default=2, help="decode steps to check")
    p.add_argument("--seed", type=cli_args.int_in(0, 2**32 - 1), default=0,
                   help="weights and token seed; with --examples, the seed of the drawn "
                        "cases (pytest --mk-seed draws the same; weights from seed 0)")
    p.add_argument("--hf", default=None, help="check against a Hugging Face fixture folder")
    p.add_argument("--examples", type=cli_args.int_in(0), default=0,
                   help="property-test N drawn cases (batch, tokens, positions, ids)")
    p.add_argument("--max-weights-gib", type=cli_args.positive_float, default=2.0,
                   help="refuse models with more weight bytes than this (interpret mode "
                        "runs on the CPU)")


def cmd_aot(args) -> int:
    from megakernel.backends.pallas_tpu.aot.tpu_compile import aot_compile

    _, plan, module = open_compiled(args, args.dir)
    cli_args.check_topology(args.topology, plan.target.chip, plan.shard.cores)
    with cli_args.progress(f"compiling for {args.topology} with libtpu"):
        result = aot_compile(module, plan, topology=args.topology)
    print(aot_line(result))
    if args.profile:
        from megakernel.backends.pallas_tpu.aot.profile_kernel import profile

        with cli_args.progress("libtpu's static schedule of the kernel, cut to two depths"):
            work = profile(plan, topology=args.topology)
        print(work.summary())
    return 0


def _aot_args(p) -> None:
    p.add_argument("dir", help="a directory written by `megakernel compile`")
    _trust_edited_arg(p)
    p.add_argument("--topology", type=cli_args.topology, default="tpu7x:2x2x1",
                   metavar="TOPOLOGY", help="TPU topology, e.g. tpu7x:2x2x1")
    p.add_argument("--profile", action="store_true",
                   help="also report libtpu's static schedule of the kernel: core work on "
                        "the critical path by unit, and headroom against the HBM floor")


def cmd_demo(args) -> int:
    """The main job on the default model: plan, emit, check, AOT-compile."""
    import tempfile
    from pathlib import Path

    from megakernel.backends.pallas_tpu.aot.tpu_compile import aot_compile
    from megakernel.backends.pallas_tpu.check.kernel_check import check
    from megakernel.backends.pallas_tpu.codegen import load
    from megakernel.compiler import report
    from megakernel.models.weights import init_weights

    args.model = args.model or "tiny-moe"
    cli_args.check_topology(args.topology, args.target, args.devices)
    model = cli_args.load(args.model)
    print(f"model {model.name}: {len(model.layers)} layers in {len(model.stacks)} stack(s), "
          f"{model.param_count:,} parameters")
    out = args.output or tempfile.mkdtemp(prefix="megakernel-demo-")
    model, plan = compile_into(out, args, model)
    print(f"kernel: {out}/kernel.py")
    module = load.import_module(Path(out) / "kernel.py")   # the file just written, checked below
    with cli_args.progress(f"interpret-mode check on {args.devices} virtual devices"):
        result = check(model, plan, init_weights(model, 0), steps=args.steps, seed=0,
                       module=module)
    print(check_line(result))
    with cli_args.progress("AOT compile for TPU7x"):
        aot = aot_compile(module, plan, topology=args.topology)
    print(aot_line(aot))
    print(report.terminal(plan, buffers=False))
    return 0 if result.ok else 1


def _demo_args(p) -> None:
    cli_args.plan_args(p, model_optional=True)
    p.set_defaults(devices=4, steps_per_call=1)    # the demo checks single steps
    p.add_argument("--output", "-o", default=None, help="where to write the kernel")
    p.add_argument("--steps", type=cli_args.int_in(1), default=2)
    p.add_argument("--topology", type=cli_args.topology, default="tpu7x:2x2x1",
                   metavar="TOPOLOGY")


COMMANDS = {
    "list": (cmd_list, "list the zoo's models: family, layers, parameters", ["megakernel list"]),
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
    "generate": (cmd_generate, "greedy tokens from the kernel, N steps per call, vs the reference",
                 ["megakernel generate tests/fixtures/hf/qwen3 --prompt-ids 1,2,3 --max-new 8",
                  "megakernel generate tiny-moe --random-weights --prompt-ids 1,2,3 --max-new 20",
                  "megakernel generate tiny-dense --random-weights --prompt-ids 5,6 7,8 "
                  "--max-new 8 --steps-per-call 4 --end-id 2"]),
    "calibrate": (cmd_calibrate, "measure the cost model's compute rates with libtpu's static "
                  "profile; writes the generated table", ["megakernel calibrate"]),
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
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (fn, help_text, examples) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text,
                           epilog=_examples(examples),
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        # SUPPRESS: `megakernel --debug plan ...` and `megakernel plan --debug ...` both work.
        p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                       help="show tracebacks on errors")
        ADD_ARGS.get(name, cli_args.model_arg)(p)
        p.set_defaults(fn=fn, subparser=p)
    return parser


ADD_ARGS: dict = {"plan": _plan_json_args, "compile": _compile_args, "check": _check_args,
                  "aot": _aot_args, "demo": _demo_args, "generate": _generate_args,
                  "calibrate": _calibrate_args, "list": list_args, "show": show_args}


def _version() -> str:
    from megakernel.cli.artifact import version

    return f"megakernel {version()}"


# An error message is cut to this many characters: textwrap.fill takes time
# quadratic in the length, and a 20 MB value would hang the printer.
MAX_ERROR_CHARS = 4000


def error_text(message: str) -> str:
    """``message`` as printed: cut to MAX_ERROR_CHARS, saying how much was cut."""
    if len(message) > MAX_ERROR_CHARS:
        cut = len(message) - MAX_ERROR_CHARS
        message = f"{message[:MAX_ERROR_CHARS]} ... [{cut:,} more characters not shown]"
    return textwrap.fill(f"error: {message}", width=88)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        return _main(argv)
    except KeyboardInterrupt:
        # Ctrl-C before a command's own handling starts (argument parsing, the
        # imports it does): the same one line as during a command.
        if "--debug" in argv:
            raise
        print(interrupts.message(signal.SIGINT), file=sys.stderr)
        return 128 + signal.SIGINT
    except BrokenPipeError:
        # The reader stopped reading (`megakernel plan ... | head -1`): quiet,
        # as a tool killed by SIGPIPE; what is left to print goes nowhere, so
        # the interpreter's final flush cannot fail again (see the Python
        # docs' note on SIGPIPE).
        with contextlib.suppress(OSError, ValueError):   # a stdout with no descriptor
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            os.close(devnull)
        return 128 + signal.SIGPIPE


def _main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    from megakernel import virtual_devices

    # One virtual CPU device per core of an interpret-mode check: more than the
    # 8 asked for above when --devices wants them, before jax starts.
    if getattr(args, "devices", 1) > virtual_devices.count() and not virtual_devices.started():
        virtual_devices.configure(args.devices)
    import megakernel.kinds  # noqa: F401 - every op kind's rules, checked complete
    try:
        with interrupts.raised(f"megakernel {args.command}"):
            code = args.fn(args)
            sys.stdout.flush()   # a closed pipe is found here, not at exit
            return code
    except KeyboardInterrupt as err:
        if args.debug:
            raise
        signum = getattr(err, "signum", signal.SIGINT)
        print(interrupts.message(signum), file=sys.stderr)
        return 128 + signum
    except BrokenPipeError:
        raise       # main's: not a path the user gave
    except (MegakernelError, OSError) as err:
        # OSError: a path the user gave that cannot be used (missing, a name too
        # long, no permission); the message names it.
        if args.debug:
            raise
        print(error_text(str(err)), file=sys.stderr)
        return 2
