"""Run pytest as a user does: in a fresh folder, in a subprocess, from a shell
with none of the variables the project's own conftest.py sets for its suite."""

import os
import subprocess
import sys
from pathlib import Path


def user_env() -> dict:
    return {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}


def run_pytest(folder: Path, *args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    """``python -m pytest -q ARGS`` in ``folder`` (its own rootdir: the project's
    conftest.py and settings do not apply)."""
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           *args], capture_output=True, text=True, cwd=folder, env=user_env(),
                          timeout=timeout)
