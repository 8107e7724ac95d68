"""backends/pallas_tpu: Plan -> one grid-less Pallas TPU megakernel per decode step.

Four folders, one role each (the first two are what a compiled kernel needs;
the last two only what checks and measures it):

    codegen/   plan -> the kernel module's source: ``emit.render`` (jinja2 template
               + one emitter per op kind), ``load.compile_model`` (write
               DIR/kernel.py, ast-check, import; errors name file, line, node),
               ``operands`` (full weights / caches -> the per-core operands)
    kernels/   the libraries the generated kernel calls: ``blocks`` (as ``rt``),
               the weight ring, each op kind's kernel library, collectives, the
               in-kernel step loop, and the appended-state write-back and state
               commit that run after the call in the same jit
    check/     interpret-mode decode steps against the plain-JAX reference
               (``against_reference.check``, ``multistep``), every executed DMA
               of one step (``trace_dmas``)
    aot/       real TPU7x compile from shapes (``tpu_compile.aot_compile``),
               libtpu's static schedule (``static_profile``, ``profile_kernel``),
               the calibration micro-kernels
"""
