"""The command line: ``megakernel show | plan | compile | check | aot | generate |
calibrate | demo``.

    commands.py    the subcommands and ``main`` (exit 2 on a project error)
    args.py        argument types, the plan flags, model loading
    check_hf.py    ``check DIR --hf DIR``: a Hugging Face fixture through the kernel
    generate.py    ``generate``: greedy tokens through the kernel
    generation.py  prefill with the reference, decode in calls of N steps
    calibrate.py   ``calibrate``: the cost model's measured constants
    artifact.py    the compiled folder (kernel.py, plan.json, manifest)
    outdir.py      output folders written whole or not at all
    interrupts.py  Ctrl-C and SIGTERM leave no partial output
"""

from megakernel.cli.commands import COMMANDS, MAX_ERROR_CHARS, main  # noqa: F401
