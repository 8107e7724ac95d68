"""``megakernel generate``: greedy tokens from the kernel, N steps per call.

Prefills with the reference, calls the kernel in chunks of ``--steps-per-call``
steps (``megakernel.cli.generation``) with a progress line per call, prints each
row's tokens and whether they match the reference's greedy continuation
(exit 1 if not). Weights are random (``--seed``): interpret mode checks the
kernel, not a checkpoint.
"""

from __future__ import annotations

import sys

from megakernel.cli import args as cli_args


def cmd_generate(args) -> int:
    """Greedy tokens from the kernel (prefill by the reference, then calls of
    N steps), checked against the reference's own greedy continuation."""
    from megakernel.cli.generation import (generate, plan_for, print_progress, prompt_array,
                                           reference_greedy)
    from megakernel.models.weights import init_weights

    model = cli_args.cut_layers(cli_args.load(args.model), args.layers)
    cli_args.fits_interpreter(model, args.max_weights_gib)
    prompt = prompt_array(args.prompt_ids, model.vocab_size)
    steps = ("steps per call chosen by the planner" if args.steps_per_call == "auto"
             else f"{args.steps_per_call} steps per call")
    # Planned first: a refused plan costs no reference decoding.
    with cli_args.progress(f"planning {model.name} for {args.devices} core(s), {steps}"):
        plan = plan_for(model, prompt, args.max_new, steps_per_call=args.steps_per_call,
                        devices=args.devices, end_id=args.end_id)
    weights = init_weights(model, args.seed)
    with cli_args.progress("reference greedy continuation"):
        want = reference_greedy(model, weights, prompt, args.max_new, args.end_id)
    print(f"  emitting {model.name}, {plan.request.steps} steps per call", file=sys.stderr)
    got = generate(model, prompt, args.max_new, devices=args.devices, weights=weights,
                   end_id=args.end_id, plan=plan, progress=print_progress)
    for b, row in enumerate(got.tokens):
        print(f"row {b}: {' '.join(str(int(t)) for t in row)}")
    same = bool((got.tokens == want).all())
    print(f"{'MATCH' if same else 'MISMATCH'}: {got.calls} kernel call(s) of "
          f"{got.plan.request.steps} steps vs the reference's greedy continuation "
          f"(random weights, seed {args.seed})")
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
    p.add_argument("--end-id", type=cli_args.int_in(-1), default=-1,
                   help="end-of-sequence id: a row stops after emitting it (-1: none)")
    p.add_argument("--layers", type=cli_args.int_in(1), default=None,
                   help="cut the model to its first K layers")
    p.add_argument("--seed", type=cli_args.int_in(0, 2**32 - 1), default=0,
                   help="random weights seed")
    p.add_argument("--max-weights-gib", type=cli_args.positive_float, default=2.0,
                   help="refuse models with more weight bytes than this (interpret mode)")
