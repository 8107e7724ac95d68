"""models: the zoo, model cards, Hugging Face import, checkpoints, the reference.

``load_model`` (from ``models.load``) turns a zoo name, a card or graph JSON
file, or a HF config / checkpoint folder into a ``Model``.

Importing the package registers every op kind's reference and weight-init
rules (each kind's in its ``kind_<name>.py`` module listed below; the
projection's and the residual add's in reference.py and weights.py;
docs/architecture.md).
"""

from megakernel.models import (kind_attention, kind_elementwise,  # noqa: F401
                               kind_expert_combine, kind_gdn,
                               kind_mla, kind_mlp, kind_moe, kind_norm_parts,
                               kind_residual_gate, kind_rmsnorm)

from megakernel.models.load import load_model

__all__ = ["load_model"]
