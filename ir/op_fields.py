"""Field types and option enums of op kinds, and the field error they raise.

After import: ``Dim``, ``Heads``, ``HeadDim``, ``Positions`` and
``FreqFactor`` are the checked field types every op module annotates with
(their ranges in ir/limits.py), ``Activation`` and ``Scoring`` the option
enums, and ``_fail`` the error an op's ``__post_init__`` raises about one
of its fields. Nothing here knows an op; ir/ops.py re-exports all of it.
"""

from __future__ import annotations

import enum

from megakernel.errors import IRError
from megakernel.ir import limits
from megakernel.ir.schema import Float, Int

# Field types of ops (ranges in ir/limits.py, docs/validation.md).
Dim = Int(1, limits.MAX_WIDTH)
Heads = Int(1, limits.MAX_HEADS)
HeadDim = Int(1, limits.MAX_HEAD_DIM)
Positions = Int(1, limits.MAX_SEQ_LEN)
FreqFactor = Float(limits.ROPE_FREQ_FACTOR[0], limits.ROPE_FREQ_FACTOR[1], open_low=True)


class Activation(enum.Enum):
    SILU = "silu"
    GELU = "gelu"            # exact (erf) GELU
    GELU_TANH = "gelu_tanh"  # tanh approximation
    SIGMOID = "sigmoid"
    TANH = "tanh"


class Scoring(enum.Enum):
    SOFTMAX = "softmax"
    SIGMOID = "sigmoid"


def _fail(field_name: str, message: str) -> IRError:
    # The message already says `field=value`; the path stops at the op.
    del field_name
    return IRError(message)
