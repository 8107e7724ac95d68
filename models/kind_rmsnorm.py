"""Reference and weight init of RMSNorm (ir/ops.py): ``rmsnorm`` itself is
reference.py's (the norms inside other kinds' references use it too); its
weight is drawn as a scale."""

from __future__ import annotations

from megakernel.models.reference import REFERENCE, rmsnorm
from megakernel.models.weights import INIT

REFERENCE.register("rmsnorm")(lambda n, p, xs, ctx: rmsnorm(n.op, p, xs[0]))
INIT.register("rmsnorm")({"weight": ("scale", 0)})
