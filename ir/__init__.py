"""ir: the layer graph - op kinds, layers, models, cards, verification, JSON.

Importing the package registers every op kind of the IR: the core kinds
(ops.py, attention_ops.py, ffn_ops.py) and each ``kind_<name>.py`` listed
below, so a graph or plan read in a fresh process finds every kind. A new op
kind adds its module here (docs/architecture.md, "Adding an op kind").
"""

from megakernel.ir import kind_elementwise, kind_gdn, kind_mla, kind_norm_parts  # noqa: F401
