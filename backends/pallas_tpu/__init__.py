"""backends/pallas_tpu: Plan -> one grid-less Pallas TPU megakernel per decode step.

    emit.render        plan -> module source (jinja2 template + one emitter per op kind)
    load.load          write DIR/kernel.py, ast-check, import; errors name file, line, node
    pack               full weights / caches -> the kernel's per-core operands
    run.check          interpret-mode decode steps vs the plain-JAX reference
    trace.trace_step   every executed DMA of one step (interpreter hook)
    aot.aot_compile    real TPU7x compile from shapes; the compiler's VMEM use
"""

from __future__ import annotations

from pathlib import Path


def compile_model(model, plan, out_dir, *, synchronised: bool = False) -> Path:
    """Write ``out_dir/kernel.py`` for ``plan`` (checked with ``ast``); returns its
    path. ``synchronised``: the synchronised-ops ablation of the same plan."""
    from megakernel.backends.pallas_tpu import emit, load

    path = load.write(emit.render(model, plan, synchronised=synchronised), out_dir)
    load.check_syntax(path)
    return path


def check(model, plan, weights, *, steps: int = 2, seed: int = 0, **kw):
    """Decode ``steps`` steps in interpret mode vs the reference -> CheckResult."""
    from megakernel.backends.pallas_tpu import run

    return run.check(model, plan, weights, steps=steps, seed=seed, **kw)


def aot_compile(out_dir_or_module, plan, topology: str = "tpu7x:2x2x1", **kw):
    """Compile the kernel for a real TPU topology from shapes -> AotResult."""
    from megakernel.backends.pallas_tpu import aot

    return aot.aot_compile(out_dir_or_module, plan, topology=topology, **kw)
