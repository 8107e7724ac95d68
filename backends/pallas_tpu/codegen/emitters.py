"""The emitter table: one rule per op kind, (stack context, node) -> the source
lines of its op inside a stack's layer body (kind_*.py registers each kind's;
emit.py the projection's and the residual add's). Kept apart from emit.py so the modules emit.py calls
(the prologue and epilogue, the stack loops) read the table without importing
emit.py back."""

from __future__ import annotations

from megakernel.registry import Registry

EMITTERS: Registry = Registry("emitter", "backends/pallas_tpu/codegen/emit.py or kind_<name>.py")


def v(tensor: str) -> str:
    """Python variable of a layer tensor."""
    return f"t_{tensor}"
