"""A Hugging Face fixture's ``expected.npz``, read as untrusted data.

The archive is opened with ``allow_pickle=False`` (an object array is refused,
never unpickled) and every array the check reads is checked against the model
built from the fixture's ``config.json`` before any kernel is built: present,
numeric of the right kind, of the right shape, token ids inside the
vocabulary, logits finite and not all zero (they scale the error); Gated
DeltaNet states are read as floats here and their shapes checked where they
are compared (hf_fixture.py). Each problem is a ``CheckError`` naming the file
and the array.
"""

from __future__ import annotations

import zipfile
import zlib
from pathlib import Path

import numpy as np

from megakernel.errors import CheckError

STEPS = ("prefill", "decode_1", "decode_2")
IDS = {"prefill": "prefill_ids", "decode_1": "decode_ids_1", "decode_2": "decode_ids_2"}


def _fail(path: Path, key: str, message: str, hint: str) -> CheckError:
    return CheckError(message, path=f"{path}:{key}" if key else str(path), hint=hint)


def _array(archive, path: Path, key: str, kind: str) -> np.ndarray:
    """``archive[key]``, an array of dtype kind ``kind`` ("i": integers, "f": floats)."""
    if key not in archive.files:
        raise _fail(path, key, f"the array {key!r} is missing; found {sorted(archive.files)[:12]}",
                    "write the fixture with tools/make_hf_fixtures.py")
    try:
        value = archive[key]
    except (ValueError, OSError, EOFError, zipfile.BadZipFile, zlib.error) as err:
        # an object array (allow_pickle=False), or a damaged member
        raise _fail(path, key, f"cannot be read as a numeric array: {err}",
                    "store plain numeric arrays (no Python objects)") from None
    want = {"i": "integers", "f": "floats"}[kind]
    if value.dtype.kind not in ("iu" if kind == "i" else "f"):
        raise _fail(path, key, f"expected {want}, found dtype {value.dtype}",
                    f"store {key} as {want}")
    return value


def _shape(value, want: tuple, path: Path, key: str) -> None:
    if value.shape != want:
        raise _fail(path, key, f"expected shape {list(want)}, found {list(value.shape)}",
                    "write the fixture again from this config.json")


def load_expected(folder, model) -> dict[str, np.ndarray]:
    """The arrays of ``folder/expected.npz`` that the fixture check reads,
    each checked against ``model``."""
    path = Path(folder) / "expected.npz"
    try:
        archive = np.load(path, allow_pickle=False)
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as err:
        raise _fail(path, "", f"is not a readable .npz archive: {err}",
                    "write it with numpy.savez (tools/make_hf_fixtures.py)") from None
    if not isinstance(archive, np.lib.npyio.NpzFile):
        raise _fail(path, "", "holds one array, not an .npz archive of named arrays",
                    "write it with numpy.savez (tools/make_hf_fixtures.py)")
    with archive:
        out = {}
        ids = _array(archive, path, "prefill_ids", "i")
        if ids.ndim != 2 or 0 in ids.shape:
            raise _fail(path, "prefill_ids", f"expected [batch, tokens] with both at least 1, "
                        f"found shape {list(ids.shape)}", "store a 2-d array of token ids")
        b, t0 = ids.shape
        if t0 + len(STEPS) - 1 > model.max_seq_len:
            raise _fail(path, "prefill_ids", f"{t0} prompt tokens and 2 decode steps pass "
                        f"max_seq_len={model.max_seq_len}", "use a shorter prompt")
        for step in STEPS:
            key = IDS[step]
            out[key] = ids if step == "prefill" else _array(archive, path, key, "i")
            _shape(out[key], (b, t0 if step == "prefill" else 1), path, key)
            if out[key].min() < 0 or out[key].max() >= model.vocab_size:
                raise _fail(path, key, f"token ids must lie in [0, {model.vocab_size}), found "
                            f"{out[key].min()}..{out[key].max()}",
                            f"use ids below the vocabulary size {model.vocab_size}")
            key = f"logits_{step}"
            out[key] = _array(archive, path, key, "f")
            _shape(out[key], (*out[IDS[step]].shape, model.vocab_size), path, key)
            if not np.isfinite(out[key]).all() or not np.abs(out[key]).max() > 0:
                raise _fail(path, key, "logits must be finite and not all zero (they scale "
                            "the error)", "write the fixture again")
        for key in archive.files:     # Gated DeltaNet states, checked where compared
            if key.startswith(("conv_state_", "recurrent_state_")):
                out[key] = _array(archive, path, key, "f")
    return out
