#!/usr/bin/env python3
"""Generate tiny random Hugging Face checkpoints plus reference logits.

These fixtures give the megakernel an *independent* parity check: the expected
logits come from the Hugging Face `transformers` implementation itself, not from
this project's reference code.

Run inside the separate `.venv-hf` virtualenv (torch CPU + transformers); the
normal project venv does not need torch.  Use `make hf-fixtures`.

For every family a folder tests/fixtures/hf/<name>/ is written with
  config.json, model.safetensors (bf16 weights, as written by save_pretrained),
  expected.npz (token ids + float32 logits for a prefill and two decode steps;
  Gated DeltaNet families also store HF's conv/recurrent cache states).
<name> is the model_type, except qwen3_5 (model_type qwen3_5_text),
deepseek_v3_nolora (model_type deepseek_v3) and the checkpoints quantized as
shipped (<family>_<format>: gpt_oss_mxfp4, deepseek_v3_fp8, qwen3_nvfp4,
muse_spark_nvfp4).  Each family is one FixtureSpec of
tools/hf_fixtures/spec.py; tools/hf_fixtures/build.py writes it and
tools/hf_fixtures/verify.py re-checks it.

The expected logits are computed in float32 (eager attention) by a model that
is *reloaded from the saved bf16 checkpoint* with dtype=float32, so they match
exactly what a loader of the fixture files sees.

Usage:
  python tools/make_hf_fixtures.py [--out DIR] [--only FAMILY ...]
  python tools/make_hf_fixtures.py --verify [--out DIR] [--only FAMILY ...]   # reload + recheck
  python tools/make_hf_fixtures.py --greedy [--out DIR] [--only FAMILY ...]   # greedy.json only
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402

from hf_fixtures import build, spec  # noqa: E402  (tools/ is this script's folder)
from hf_fixtures import greedy  # noqa: E402
from hf_fixtures.verify import verify  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO_ROOT / "tests" / "fixtures" / "hf"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--only", nargs="*", default=None)
    ap.add_argument("--verify", action="store_true", help="only reload and recheck existing fixtures")
    ap.add_argument("--greedy", action="store_true",
                    help="only write each fixture's greedy.json (transformers' greedy generate)")
    args = ap.parse_args(argv)

    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, numpy {np.__version__}")

    if args.verify:
        return verify(args.out, args.only) | greedy.verify(args.out, args.only)
    if args.greedy:
        return greedy.write(args.out, args.only)

    args.out = args.out.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.only:
        unknown = set(args.only) - set(spec.names())
        if unknown:
            raise SystemExit(f"unknown families {sorted(unknown)}; known: {spec.names()}")
    for s in spec.specs():
        if args.only and s.name not in args.only:
            continue
        build.make(s, args.out)
    greedy.write(args.out, args.only)
    return verify(args.out, args.only) | greedy.verify(args.out, args.only)


if __name__ == "__main__":
    sys.exit(main())
