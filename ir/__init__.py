"""ir: the layer graph - op kinds, layers, models, cards, verification, JSON.

Importing the package registers every op kind of the IR, and the card's
mixers and FFNs: each ``kind_<name>.py`` listed below, and the projection and
residual add of op_base.py, so a graph, card or plan read in a fresh process
finds every kind. A new op kind adds its module here (docs/architecture.md,
"Adding an op kind").
"""

from megakernel.ir import (kind_attention, kind_elementwise, kind_expert_combine,  # noqa: F401
                           kind_gdn, kind_mla, kind_mlp, kind_moe, kind_norm_parts,
                           kind_residual_gate, kind_rmsnorm)
