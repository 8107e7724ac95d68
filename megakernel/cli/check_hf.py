"""``megakernel check DIR --hf DIR``: decode a Hugging Face fixture folder
through the kernel against the logits transformers wrote.

The fixture brings its own model (config.json and weights), so MODEL must
name that folder (or its config.json): a different MODEL would otherwise be
ignored without a word. The planning flags other than ``--devices`` do not
apply (the fixture fixes batch and tokens), and are refused by name.
"""

from __future__ import annotations

from pathlib import Path

from megakernel.cli import args as cli_args


def check_hf(args) -> int:
    from megakernel.errors import CheckError, shown
    from megakernel.testing import check_hf_fixture

    fixture = Path(args.hf)
    given = Path(args.model)
    same = given.name == "config.json" and given.parent or given
    usable = None
    try:
        usable = fixture.is_dir()
        usable = usable and same.exists() and same.resolve() == fixture.resolve()
    except (OSError, ValueError) as err:
        # a name too long for the file system, a NUL byte: say which argument gave it
        flag, text = ("--hf", args.hf) if usable is None else ("MODEL", args.model)
        reason = getattr(err, "strerror", None) or str(err)
        raise CheckError(f"cannot look at {shown(text)}: {shown(reason)}", path=flag,
                         hint="give the fixture folder") from None
    if not usable:
        raise CheckError(f"MODEL {args.model!r} is not the fixture folder {args.hf!r}: --hf "
                         "checks the model of the fixture's own config.json and weights",
                         path="--hf", hint=f"give the fixture folder as MODEL: megakernel "
                                           f"check {args.hf} --hf {args.hf}")
    given_flags = [name for name in cli_args.PLAN_FLAGS if name != "devices"
                   and getattr(args, name, None) != args.subparser.get_default(name)]
    for name in given_flags + [n for n in ("steps", "seed") if
                               getattr(args, n) != args.subparser.get_default(n)]:
        flag = "--" + name.replace("_", "-")
        raise CheckError(f"{flag} does not apply to --hf: the fixture fixes its prompts, "
                         "steps and weights", path=flag, hint=f"leave {flag} out")
    with cli_args.progress(f"decoding the HF fixture {args.hf} through the kernel"):
        errors = check_hf_fixture(args.hf, devices=args.devices)
    for step, err in errors:
        print(f"{step:10s} max |kernel - HF| = {err:.2e} of the logit scale")
    return 0 if all(err <= 1e-4 for _, err in errors) else 1
