"""A successful `megakernel aot` prints no libtpu start-up errors.

On a machine with no TPU chip libtpu looks for its accelerator type, host
bounds and worker hostnames at start-up and, finding none, printed error
lines (``TPU_ACCELERATOR_TYPE``, ``TPU_WORKER_HOSTNAMES``) to stderr although
the compile succeeded. backends/pallas_tpu/aot/tpu_compile.py tells it this host is alone.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from megakernel.cli import artifact
from megakernel.compiler.pipeline import plan_model
from megakernel.models import zoo

pytest.importorskip("libtpu")

# What libtpu printed at start-up before aot.py set its host up.
NOISE = ("TPU_ACCELERATOR_TYPE", "TPU_WORKER_HOSTNAMES", "host bounds", "worker hostname",
         "Logging before InitGoogle", "libtpu_init_utils")
# Set by this process (jax's import, aot.py) and so not inherited: the child
# must find its own, as a user's shell would.
OWN = ("TPU_SKIP_MDS_QUERY", "TPU_HOST_BOUNDS", "TPU_WORKER_HOSTNAMES", "TPU_ACCELERATOR_TYPE")


@pytest.mark.aot
@pytest.mark.slow
def test_successful_aot_prints_no_libtpu_start_up_noise(tmp_path):
    cli = Path(sys.executable).with_name("megakernel")
    if not cli.exists():
        pytest.skip(f"no megakernel command beside {sys.executable}")
    model = zoo.model("tiny-dense")
    artifact.write(tmp_path, model, plan_model(model, devices=1, batch=1, tokens=1))
    env = {k: v for k, v in os.environ.items() if k not in OWN}
    proc = subprocess.run([str(cli), "aot", str(tmp_path)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "VMEM used" in proc.stdout
    noise = [line for line in proc.stderr.splitlines() if any(n in line for n in NOISE)]
    assert not noise, "libtpu start-up lines on stderr of a successful aot:\n" + "\n".join(noise)
