"""Code generation: a plan -> one readable Pallas module (emit.py renders
the jinja2 template with one emitter per op kind; load.py writes, checks and
imports it).

Importing the package registers every op kind's emitter (the projection's
and the residual add's in emit.py, each other kind's in its
``kind_<name>.py`` module listed below; docs/architecture.md)."""

from megakernel.backends.pallas_tpu.codegen import (  # noqa: F401
    emit, kind_attention, kind_elementwise, kind_expert_combine, kind_gdn, kind_mla, kind_mlp,
    kind_moe, kind_norm_parts, kind_residual_gate, kind_rmsnorm)
