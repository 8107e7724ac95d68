"""Reload each committed fixture with transformers and re-run its prefill and
decodes (and, for Gated DeltaNet fixtures, re-check the stored cache states)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from .reference import StateRecorder, assert_torch_paths, linear_layers, load_fp32, run_reference
from .spec import names


def reloaded(out_root: Path, only):
    """(name, folder, expected.npz, model reloaded in float32) of each
    committed fixture (of ``only``, if given), transformers on its torch paths."""
    for name in names():
        if only and name not in only:
            continue
        d = out_root / name
        exp = np.load(d / "expected.npz")
        model = load_fp32(d)
        if linear_layers(model.config):
            assert_torch_paths()
        yield name, d, exp, model


def verify(out_root: Path, only) -> int:
    """0 if every fixture (of ``only``, if given) reproduces within 1e-5, else 1."""
    bad = 0
    for name, d, exp, model in reloaded(out_root, only):
        states = StateRecorder(model.config) if linear_layers(model.config) else None
        with torch.no_grad():
            lp, l1, l2 = run_reference(
                model,
                torch.from_numpy(exp["prefill_ids"]).long(),
                torch.from_numpy(exp["decode_ids_1"]).long(),
                torch.from_numpy(exp["decode_ids_2"]).long(),
                on_step=states,
            )
        errs = [
            float(np.abs(lp - exp["logits_prefill"]).max()),
            float(np.abs(l1 - exp["logits_decode_1"]).max()),
            float(np.abs(l2 - exp["logits_decode_2"]).max()),
        ]
        extra = ""
        if states:
            assert set(states.arrays) | set(exp.files) == set(exp.files), "missing state arrays"
            serr = max(float(np.abs(v - exp[k]).max()) for k, v in states.arrays.items())
            errs.append(serr)
            extra = f" (+ {len(states.arrays)} state arrays, maxdiff {serr:.2e})"
        ok = max(errs) < 1e-5
        bad += not ok
        print(f"verify {name}: maxdiff prefill/decode1/decode2 = {errs[:3]}{extra} {'OK' if ok else 'FAIL'}")
    return 1 if bad else 0
