"""models: the zoo, model cards, Hugging Face import, checkpoints, the reference.

``load_model`` (from ``models.load``) turns a zoo name, a card or graph JSON
file, or a HF config / checkpoint folder into a ``Model``.

Importing the package registers every op kind's reference and weight-init
rules (the core kinds in reference.py and weights.py, the others in the
``kind_<name>.py`` modules listed below; docs/architecture.md).
"""

from megakernel.models import kind_elementwise, kind_gdn, kind_mla, kind_norm_parts  # noqa: F401

from megakernel.models.load import load_model

__all__ = ["load_model"]
