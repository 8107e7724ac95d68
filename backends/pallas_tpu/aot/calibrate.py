"""Measure the calibration micro-kernels with libtpu's static profile.

``measure(names)`` AOT-compiles each named kernel of ``calibrate_kernels.KERNELS``
(both sizes) in one child process that has libtpu's profile flags, and returns
``{name: [small cycles, large cycles]}`` (or the error text of a kernel that
failed). ``calibrate(path)`` measures every kernel and writes the generated
table (``compiler/calibration.py``).
"""

from __future__ import annotations

import importlib.metadata
import tempfile

from megakernel.backends.pallas_tpu.aot import calibration_kernels as calibrate_kernels
from megakernel.backends.pallas_tpu.aot import static_profile

WORKER = "megakernel.backends.pallas_tpu.aot.calibration_kernels"


def measure(names=None, *, timeout: float = 900.0) -> dict:
    names = list(names or calibrate_kernels.KERNELS)
    unknown = [n for n in names if n not in calibrate_kernels.KERNELS]
    if unknown:
        raise KeyError(f"unknown calibration kernels {unknown}; known: "
                       f"{sorted(calibrate_kernels.KERNELS)}")
    with tempfile.TemporaryDirectory(prefix="megakernel-calibrate-") as dump:
        return static_profile.run_child(WORKER, [dump, *names], dump, timeout)


def versions() -> dict:
    return {pkg: importlib.metadata.version(pkg) for pkg in ("libtpu", "jax")}


def calibrate(path, *, chip: str = "tpu7x", command: str = "megakernel calibrate",
              only=None) -> dict:
    """Measure every micro-kernel and write the table to ``path`` -> the table.
    ``only``: re-measure just these kernels, keeping the other measurements of
    the table at ``path``, which must come from the same libtpu and jax."""
    import json
    from pathlib import Path

    from megakernel.compiler import calibration
    from megakernel.compiler.target import make_target

    kept = {}
    if only:
        from megakernel.errors import EmitError

        old = json.loads(Path(path).read_text())
        stale = {k: (old.get(k), v) for k, v in versions().items() if old.get(k) != v}
        if stale:
            raise EmitError(f"calibrate --only keeps the table's other measurements, made "
                            f"with other versions: {stale}", path="calibrate",
                            hint="run the whole `megakernel calibrate`")
        kept = old["measurements"]
    measured = {**kept, **measure(only)}
    failed = {n: v for n, v in measured.items() if not isinstance(v, list)}
    if failed:
        from megakernel.errors import EmitError

        raise EmitError(f"calibration kernels failed to compile: {failed}",
                        path="calibrate", hint="the table was not written; fix the kernel "
                        "in backends/pallas_tpu/aot/calibration_kernels.py or leave it out")
    return calibration.write(path, measured, make_target(chip).bf16_flops, chip=chip,
                             command=command, versions=versions())
