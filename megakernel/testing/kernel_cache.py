"""What the drawn cases of one property test share, computed once per process.

A drawn case differs from the last in its batch, tokens and positions; most of
the work of checking it does not. Kept here, by key:

    plan      (model, devices, batch, tokens)       plan_model takes ~1 s per call
    weights   (model, seed)                         random weights, numpy and jax
    module    (plan digest, fault)                  the generated kernel.py, imported
    runner    (plan digest, fault, seed, devices)   jitted step + device-resident
                                                    packed weights: the 5-20 s
                                                    interpret-mode compile

so a case whose plan was seen before costs one reference decode and one
interpret-mode step (docs/property-testing.md gives the measured seconds). A
plan digest covers the model, the target and the request, so equal digests
are the same kernel. Runners and weights hold a model's bytes, so they are
evicted least recently used beyond a byte budget; plans and modules are small.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from collections import OrderedDict
from pathlib import Path

# Bytes of packed weights the cached runners may hold together, and of numpy
# weights the cached models may hold; the most recently used entry is always
# kept, whatever its size.
RUNNER_BYTES = 4 * 2**30
WEIGHT_BYTES = 2 * 2**30
MAX_PLANS = 512

_PLANS: OrderedDict = OrderedDict()
_WEIGHTS: OrderedDict = OrderedDict()
_MODULES: dict = {}
_RUNNERS: OrderedDict = OrderedDict()
_KERNELS: list = []   # the one temporary folder of this process's cached kernels
STATS = {"plans": 0, "compiles": 0, "runners": 0, "hits": 0}


def clear() -> None:
    """Forget everything cached (tests of the cache itself use it)."""
    for table in (_PLANS, _WEIGHTS, _MODULES, _RUNNERS):
        table.clear()
    STATS.update(dict.fromkeys(STATS, 0))


def _kernels_dir() -> Path:
    """A temporary folder for the cached kernels, removed when the process exits:
    the modules stay imported (and their files readable, for error locations)
    while it runs, and no folder is left behind."""
    if not _KERNELS:
        _KERNELS.append(Path(tempfile.mkdtemp(prefix="megakernel-cases-")))
        atexit.register(shutil.rmtree, _KERNELS[0], ignore_errors=True)
    return _KERNELS[0]


def _touch(table: OrderedDict, key):
    table.move_to_end(key)
    STATS["hits"] += 1
    return table[key]


def _evict(table: OrderedDict, budget: int, nbytes) -> None:
    """Drop the least recently used entries until the rest fit ``budget``."""
    while len(table) > 1 and sum(nbytes(v) for v in table.values()) > budget:
        table.popitem(last=False)


def plan(model, devices: int, batch: int, tokens: int):
    """``plan_model(model, devices=, batch=, tokens=)``, once per key."""
    from megakernel.compiler.pipeline import plan_model

    key = (model, devices, batch, tokens)
    if key in _PLANS:
        return _touch(_PLANS, key)
    _PLANS[key] = plan_model(model, devices=devices, batch=batch, tokens=tokens)
    STATS["plans"] += 1
    while len(_PLANS) > MAX_PLANS:
        _PLANS.popitem(last=False)
    return _PLANS[key]


def weights(model, seed: int):
    """(numpy weights, the same as jax arrays) of ``init_weights(model, seed)``."""
    from megakernel.models import reference
    from megakernel.models.weights import init_weights

    key = (model, seed)
    if key in _WEIGHTS:
        return _touch(_WEIGHTS, key)
    host = init_weights(model, seed)
    _WEIGHTS[key] = (host, reference.as_jax(host))
    _evict(_WEIGHTS, WEIGHT_BYTES, lambda v: sum(a.nbytes for a in v[0].values()))
    return _WEIGHTS[key]


def kernel_module(model, plan, fault: str | None = None):
    """Compile (once per plan digest and fault) and import the kernel module;
    ``fault`` names a test-only change of the source (``megakernel.testing.faults.FAULTS``)."""
    from megakernel.backends.pallas_tpu.codegen.load import compile_model
    from megakernel.backends.pallas_tpu.codegen import load

    key = (plan.digest(), fault)
    if key in _MODULES:
        STATS["hits"] += 1
        return _MODULES[key]
    path = Path(compile_model(model, plan, tempfile.mkdtemp(dir=_kernels_dir())))
    if fault is not None:
        from megakernel.testing.faults import FAULTS

        _, old, new = FAULTS[fault]
        text = path.read_text()
        if old not in text:
            raise ValueError(f"fault {fault!r} does not apply to this kernel")
        path.write_text(text.replace(old, new))
    _MODULES[key] = load.import_module(path)
    STATS["compiles"] += 1
    return _MODULES[key]


def runner(model, plan, seed: int, fault: str | None, mesh):
    """The KernelRunner of ``plan`` with ``init_weights(model, seed)`` packed onto
    ``mesh``, once per key: its jitted step is compiled on first use and kept."""
    from megakernel.backends.pallas_tpu.check import against_reference as run

    key = (plan.digest(), fault, seed, tuple(d.id for d in mesh.devices.flat))
    if key in _RUNNERS:
        return _touch(_RUNNERS, key)
    host, _ = weights(model, seed)
    _RUNNERS[key] = run.KernelRunner(kernel_module(model, plan, fault), model, plan, host,
                                     mesh, run.interpret_params())
    STATS["runners"] += 1
    _evict(_RUNNERS, RUNNER_BYTES, lambda r: sum(a.nbytes for a in r.arrays.values()))
    return _RUNNERS[key]
