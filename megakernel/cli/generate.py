"""``megakernel generate``: greedy tokens from the kernel, N steps per call.

Prefills with the reference, calls the kernel in chunks of ``--steps-per-call``
steps (``megakernel.cli.generation``) with a progress line per call, prints each
row's tokens and whether they match the reference's greedy continuation
(exit 1 if not). An HF checkpoint folder is decoded with its own weights and
stops a row at its end ids (``megakernel.cli.checkpoint_source``); seeded
random weights only with ``--random-weights`` (a zoo card has none).
"""

from __future__ import annotations

import sys

from megakernel.cli import args as cli_args


def cmd_generate(args) -> int:
    """Greedy tokens from the kernel (prefill by the reference, then calls of
    N steps), checked against the reference's own greedy continuation."""
    from megakernel.cli import checkpoint_source
    from megakernel.cli.generation import (generate, plan_for, print_progress, prompt_array,
                                           reference_greedy)
    from megakernel.errors import CheckError
    from megakernel.models import load_model

    if args.seed is not None and not args.random_weights:
        raise CheckError("--seed seeds random weights, and none were asked for", path="--seed",
                         hint="add --random-weights, or leave --seed out to decode the "
                              "checkpoint's weights")
    model = cli_args.cut_layers(load_model(args.model, dtype=args.dtype), args.layers)
    folder = checkpoint_source.weights_folder(args.model, random_weights=args.random_weights)
    cli_args.fits_interpreter(model, args.max_weights_gib)
    prompt = prompt_array(args.prompt_ids, model.vocab_size)
    end = (checkpoint_source.end_ids(folder, model.vocab_size) or -1
           if args.end_id is None else args.end_id)
    steps = ("steps per call chosen by the planner" if args.steps_per_call == "auto"
             else f"{args.steps_per_call} steps per call")
    # Planned first: a refused plan costs no weight loading or reference decoding.
    with cli_args.progress(f"planning {model.name} for {args.devices} core(s), {steps}"):
        plan = plan_for(model, prompt, args.max_new, steps_per_call=args.steps_per_call,
                        devices=args.devices, end_id=end)
    with cli_args.progress("loading weights"):
        weights = checkpoint_source.load(folder, model, args.seed or 0, first_layers=args.layers)
    with cli_args.progress("reference greedy continuation"):
        want = reference_greedy(model, weights.arrays, prompt, args.max_new, end)
    print(f"  emitting {model.name}, {plan.request.steps} steps per call", file=sys.stderr)
    got = generate(model, prompt, args.max_new, devices=args.devices, weights=weights.arrays,
                   end_id=end, plan=plan, progress=print_progress)
    for b, row in enumerate(got.tokens):
        print(f"row {b}: {' '.join(str(int(t)) for t in row)}")
    same = bool((got.tokens == want).all())
    ends = "" if end == -1 else f", end ids {','.join(map(str, end)) if isinstance(end, tuple) else end}"
    print(f"{'MATCH' if same else 'MISMATCH'}: {got.calls} kernel call(s) of "
          f"{got.plan.request.steps} steps vs the reference's greedy continuation "
          f"({weights.label}, {model.dtype.value}{ends})")
    return 0 if same else 1


def _generate_args(p) -> None:
    cli_args.model_arg(p)
    p.add_argument("--prompt-ids", type=cli_args.id_list, nargs="+", required=True,
                   metavar="IDS", help="one prompt per sequence, comma-separated token ids "
                                       "(all of one length), e.g. 1,2,3 4,5,6")
    p.add_argument("--max-new", type=cli_args.int_in(1), required=True, metavar="N",
                   help="new tokens per sequence (the first from the reference's prefill)")
    p.add_argument("--steps-per-call", type=cli_args.steps_per_call, default="auto",
                   metavar="auto|N", help="greedy steps per kernel call (default auto: the "
                                          "planner's choice, compiler/choose_steps.py)")
    p.add_argument("--devices", "-n", type=cli_args.devices, default=1, help="TensorCores")
    p.add_argument("--end-id", type=cli_args.int_in(-1), default=None,
                   help="end-of-sequence id: a row stops after emitting it (-1: none; "
                        "default: the checkpoint's eos_token_id, none for random weights)")
    p.add_argument("--layers", type=cli_args.int_in(1), default=None,
                   help="cut the model to its first K layers")
    p.add_argument("--random-weights", action="store_true",
                   help="decode seeded random weights instead of the checkpoint's (the "
                        "only weights a zoo card or an IR file has)")
    p.add_argument("--seed", type=cli_args.int_in(0, 2**32 - 1), default=None,
                   help="seed of --random-weights (default 0)")
    p.add_argument("--dtype", default=None, metavar="DTYPE",
                   help="weights and caches in this dtype (default: the model's), e.g. "
                        "float32 to compare with transformers' float32 reference")
    p.add_argument("--max-weights-gib", type=cli_args.positive_float, default=2.0,
                   help="refuse models with more weight bytes than this (interpret mode)")
