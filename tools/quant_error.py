"""Quantization error against the unquantized model on the Hugging Face fixtures.

For each fixture (tests/fixtures/hf) and each weight format, the dense
matrices are rounded to the format on load (``--quantize dense=FORMAT``:
megakernel/quantize.py, round to nearest) and the plain-JAX reference decodes
the fixture's prefill and two decode steps in float32. Reported against the
same reference with the checkpoint's own weights: the largest logit error
over the three calls, relative to the logit scale, and the share of rows whose
greedy token is unchanged. The fixtures are tiny random-weight models, so this
measures the rounding of random Gaussian weights, not of a trained model's.

    .venv/bin/python -m tools.quant_error > docs/quantization-error.md
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import numpy as np
import megakernel.kinds  # noqa: F401,E402 - every op kind's rules

FIXTURES = ("llama", "qwen2", "qwen3", "mistral", "gemma2", "gemma3_text", "olmo2", "phi3",
            "mixtral", "qwen3_moe", "gpt_oss")
FORMATS = ("int8", "int4_g32", "int4_g64", "int4_g128", "fp8_b128", "mxfp4")
ROOT = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "hf"


def _logits(model, weights, exp):
    import jax.numpy as jnp

    from megakernel.models import reference

    w = reference.as_jax(weights)
    b, t0 = exp["prefill_ids"].shape
    caches = reference.init_caches(model, b)
    out = []
    for ids, start in [(exp["prefill_ids"], 0), (exp["decode_ids_1"], t0),
                       (exp["decode_ids_2"], t0 + 1)]:
        logits, caches = reference.decode_step(model, w, jnp.asarray(ids, jnp.int32),
                                               jnp.full((b,), start, jnp.int32), caches)
        out.append(np.asarray(logits))
    return out


def measure(name: str, fmt: str) -> str:
    from megakernel import formats
    from megakernel.errors import MegakernelError
    from megakernel.ir.config import build
    from megakernel.ir.weight_kinds import Quantize
    from megakernel.models.checkpoint import load_checkpoint
    from megakernel.models.hf import from_hf

    folder = ROOT / name
    card = from_hf(folder, dtype="float32")
    base = build(card)
    exp = np.load(folder / "expected.npz")
    try:
        model = build(dataclasses.replace(card, quantize=Quantize(dense=fmt)))
    except MegakernelError:
        q = formats.get(fmt).row_quantum(10**6)
        return f"n/a (an input width is not a multiple of {q})"
    want = _logits(base, load_checkpoint(folder, base), exp)
    got = _logits(model, load_checkpoint(folder, model), exp)
    err = max(float(np.max(np.abs(g - w))) / float(np.max(np.abs(w))) for g, w in zip(got, want))
    agree = np.mean(np.concatenate([(g.argmax(-1) == w.argmax(-1)).ravel()
                                    for g, w in zip(got, want)]))
    return f"{err:.3f} / {agree:.0%}"


def main() -> None:
    rows = ["| fixture | " + " | ".join(FORMATS) + " |", "|---" * (len(FORMATS) + 1) + "|"]
    for name in FIXTURES:
        rows.append(f"| {name} | " + " | ".join(measure(name, f) for f in FORMATS) + " |")
        print(rows[-1], file=sys.stderr)
    print("\n".join(rows))


if __name__ == "__main__":
    main()
