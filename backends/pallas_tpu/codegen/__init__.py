"""Code generation: a plan -> one readable Pallas module (emit.py renders
the jinja2 template with one emitter per op kind; load.py writes, checks and
imports it).

Importing the package registers every op kind's emitter (the core kinds in
emit.py, the others in the ``kind_<name>.py`` modules listed below;
docs/architecture.md)."""

from megakernel.backends.pallas_tpu.codegen import (  # noqa: F401
    emit, kind_elementwise, kind_gdn, kind_mla, kind_norm_parts)
