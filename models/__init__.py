"""models: the zoo, model cards, Hugging Face import, checkpoints, the reference.

``load_model`` (from ``models.load``) turns a zoo name, a card or graph JSON
file, or a HF config / checkpoint folder into a ``Model``.
"""

from megakernel.models.load import load_model

__all__ = ["load_model"]
