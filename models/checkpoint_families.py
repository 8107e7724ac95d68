"""Every family's checkpoint name table (models/checkpoint_names.py): the rows
of ``NAMES``, the hybrid linear-attention families' among them (registered by
models/checkpoint_hybrid.py, imported here for that), or the table DeepSeek's
families build from their config and model (models/hf_deepseek.py).
"""

from __future__ import annotations

from megakernel.ir.graph import Model
from megakernel.models import checkpoint_hybrid  # noqa: F401 - registers its families' rows
from megakernel.models import hf_deepseek
from megakernel.models.checkpoint_names import IGNORED_PREFIXES, NAMES


def family_tables(model_type: str, config: dict, model: Model):
    """(layer name table, ignored tensor prefixes) of one checkpoint: the fixed
    rows of ``NAMES``, or those a family builds from its config and model
    (models/hf_deepseek.py: head counts, the rope permutation, MTP layers)."""
    if model_type in NAMES:
        return NAMES[model_type], IGNORED_PREFIXES.get(model_type, ())
    return (hf_deepseek.checkpoint_names(config, model),
            hf_deepseek.ignored_prefixes(config))
