"""transformers' own greedy continuation of each committed fixture, written
beside it as ``greedy.json``: what `megakernel generate DIR --prompt-ids` must
print for that checkpoint (tests/cli/test_generate_checkpoint.py).

The model is the one ``verify`` reloads (float32, eager attention, from the
saved files) and ``generate`` runs with the checkpoint's own generation
settings (its EOS id stops a row; ``do_sample`` off). Each step's margin, the
top logit less the runner-up, is recorded: a continuation whose smallest
margin is below ``MARGIN_MIN`` could flip under float32 rounding of another
implementation, so it is cut before that step (and the cut recorded).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
import transformers

from .verify import reloaded

MAX_NEW = 8
# The reference's logits match transformers' within 1e-4 on these fixtures
# (tests/models/test_hf_fixtures.py: atol 1e-4); a margin of 10x that cannot
# flip under another implementation's float32 rounding.
MARGIN_MIN = 1e-3


def continuation(model, prompt: np.ndarray) -> dict:
    """{"greedy_ids": [B, n], "margins": [n]} of ``generate``'s greedy path,
    n <= MAX_NEW cut before the first step whose margin is below MARGIN_MIN."""
    eos = model.generation_config.eos_token_id
    with torch.no_grad():
        out = model.generate(torch.from_numpy(prompt).long(), max_new_tokens=MAX_NEW,
                             do_sample=False, output_scores=True,
                             return_dict_in_generate=True, pad_token_id=eos if eos is not None
                             else 0)
    new = out.sequences[:, prompt.shape[1]:].numpy()
    margins = []
    for scores in out.scores:
        top = torch.topk(scores.float(), 2, dim=-1).values
        margins.append(float((top[:, 0] - top[:, 1]).min()))
    n = next((i for i, m in enumerate(margins) if m < MARGIN_MIN), len(margins))
    return {"greedy_ids": new[:, :n].tolist(), "margins": margins[:n],
            "cut_before": None if n == len(margins) else n}


def write(out_root: Path, only) -> int:
    for name, d, exp, model in reloaded(out_root, only):
        prompt = exp["prefill_ids"]
        got = continuation(model, prompt)
        eos = model.generation_config.eos_token_id
        record = {"transformers": transformers.__version__, "prompt_ids": prompt.tolist(),
                  "eos_token_id": eos, "max_new_tokens": MAX_NEW, **got}
        (d / "greedy.json").write_text(json.dumps(record, indent=1) + "\n")
        print(f"greedy {name}: {len(got['margins'])} tokens, min margin "
              f"{min(got['margins'], default=float('nan')):.3g}, eos {eos}")
    return 0


def verify(out_root: Path, only) -> int:
    """0 if every committed greedy.json is what transformers generates now."""
    bad = 0
    for name, d, _, model in reloaded(out_root, only):
        if not (d / "greedy.json").is_file():
            continue
        want = json.loads((d / "greedy.json").read_text())
        got = continuation(model, np.asarray(want["prompt_ids"]))
        ok = got["greedy_ids"] == want["greedy_ids"]
        bad += not ok
        print(f"verify {name} greedy: {'OK' if ok else 'FAIL'}")
    return 1 if bad else 0
