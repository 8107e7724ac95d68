"""A checkpoint folder laid out as the Hugging Face hub cache stores it:
``models--ORG--NAME/blobs/<sha256>`` holds each file's bytes and
``models--ORG--NAME/snapshots/<revision>/<file>`` is a relative symlink to its
blob (what ``huggingface_hub.snapshot_download`` leaves on disk)."""

import hashlib
import os
import shutil
from pathlib import Path


def hub_snapshot(folder: Path, cache: Path, repo: str = "models--org--tiny",
                 revision: str = "0123abcd") -> Path:
    """The snapshot folder of a copy of ``folder`` under hub cache ``cache``."""
    blobs = cache / repo / "blobs"
    snapshot = cache / repo / "snapshots" / revision
    blobs.mkdir(parents=True, exist_ok=True)
    snapshot.mkdir(parents=True)
    for f in sorted(folder.iterdir()):
        digest = hashlib.sha256(f.read_bytes()).hexdigest()
        shutil.copyfile(f, blobs / digest)
        os.symlink(Path("..", "..", "blobs", digest), snapshot / f.name)
    return snapshot
