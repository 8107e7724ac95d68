#!/usr/bin/env python3
"""Profile one cut of a zoo model with libtpu's static schedule, with card and
geometry overrides: a quick way to bisect a kernel the profile pass refuses.

    .venv/bin/python tools/profile_cut.py qwen3-8b 4 num_layers=2 vocab_size=4096 \\
        intermediate_size=8192 geo.num_banks=6

``KEY=VALUE`` replaces a card field (a Python literal); ``geo.KEY=VALUE`` fixes
a planner choice (compiler/request.py ``Overrides``); ``context=N`` the planned
context (256). Prints OK with the critical path by unit, or FAIL with libtpu's
fatal line, and the seconds it took (docs/changelog.md has what was bisected).
"""

import ast
import dataclasses
import sys
import tempfile
import time
from pathlib import Path

from megakernel.backends.pallas_tpu.aot import static_profile
from megakernel.compiler.pipeline import plan_model
from megakernel.errors import MegakernelError
from megakernel.ir.config import build
from megakernel.models import zoo
import megakernel.kinds  # noqa: F401,E402 - every op kind's rules


def main(argv: list[str]) -> int:
    name, devices, *pairs = argv
    fields = dict(p.split("=", 1) for p in pairs)
    context = int(fields.pop("context", 256))
    geo = {k[4:]: ast.literal_eval(fields.pop(k)) for k in list(fields) if k.startswith("geo.")}
    card = dataclasses.replace(zoo.card(name),
                               **{k: ast.literal_eval(v) for k, v in fields.items()})
    plan = plan_model(build(card), devices=int(devices), batch=1, tokens=1, context=context,
                      overrides=geo)
    with tempfile.TemporaryDirectory() as work:
        plan_file, dump = Path(work) / "plan.json", Path(work) / "dump"
        dump.mkdir()
        plan_file.write_text(plan.to_json())
        t0 = time.perf_counter()
        try:
            got = static_profile.run_child(
                "megakernel.backends.pallas_tpu.aot.profile_kernel",
                [str(plan_file), "tpu7x:2x2x1", str(card.num_layers), str(dump)], str(dump), 600)
        except MegakernelError as err:
            print(f"FAIL {time.perf_counter() - t0:.0f} s: {err}")
            return 1
        print(f"OK {time.perf_counter() - t0:.0f} s: {got[str(card.num_layers)]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
