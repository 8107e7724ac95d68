"""The builder that turns a model card into the layer graph, and the card's names.

A card (``ir/card.py``: ``ModelConfig`` and its blocks) reads like a published
config (MaxText keeps a model in ~20 flat keys); ``build`` makes the graph
layer by layer (``ir/blocks.py`` ``layer``) from the blocks that each op kind's
``ir/kind_*.py`` registers for the card's mixers and FFNs, no if-ladders over
model families. Identical layers come out equal, so the graph groups them into stacks
by itself. The card's records and tables are imported from here.
"""

from __future__ import annotations

import math

import numpy as np

from megakernel.errors import IRError, error_context
from megakernel.ir import sizes
from megakernel.ir.blocks import LayerBuilder, layer, with_card_field
from megakernel.ir.card import (FFNS, MIXERS, LinearAttentionConfig, MLAConfig, MoEConfig,
                                ModelConfig)
from megakernel.ir.graph import Model
from megakernel.ir.kind_elementwise import Scale, Softcap
from megakernel.ir.ops import RMSNorm
from megakernel.ir.types import DType

__all__ = ["FFNS", "MIXERS", "LayerBuilder", "LinearAttentionConfig", "MLAConfig", "MoEConfig",
           "ModelConfig", "build"]


def build(config: ModelConfig) -> Model:
    """The layer graph of ``config``; errors name ``layers.{i}.{op}.{field}``.
    A card whose weights and KV caches cannot fit the largest supported
    topology is refused first, from its numbers alone (ir/sizes.py)."""
    sizes.check_fits(sizes.of_config(config), path="config")
    layers = []
    for i in range(config.num_layers):
        with error_context(f"layers.{i}"):
            layers.append(layer(config, config.mixer(i), config.layer_kind(i)))
    with error_context("final_norm"):
        try:
            offset = config.norm_offset if config.final_norm_offset is None else \
                config.final_norm_offset
            final_norm = RMSNorm(config.hidden_size, config.norm_eps, offset)
        except IRError as err:
            raise with_card_field(err) from None
    logit_ops = ()
    if config.final_logit_scale != 1.0:     # Muse Spark scales before its soft-cap
        logit_ops = (Scale(config.final_logit_scale),)
    if config.final_logit_softcap is not None:
        with error_context("final_logit_softcap"):
            logit_ops += (Softcap(config.final_logit_softcap),)
    dtype = DType.parse(config.dtype)
    embed_ops = ()
    if config.scale_embeddings:
        # Gemma casts sqrt(hidden) to the weight dtype first: 59.87 -> 59.75 in bf16.
        factor = float(np.asarray(math.sqrt(config.hidden_size), dtype.np))
        embed_ops = (Scale(factor),)
    if config.embed_norm:       # norm_eps was checked by the final norm above
        embed_ops += (RMSNorm(config.hidden_size, config.norm_eps, weight=False),)
    return Model(config.name, config.vocab_size, config.hidden_size, tuple(layers),
                 final_norm, config.tie_embeddings, dtype, config.max_seq_len, logit_ops,
                 embed_ops, config.quantize, config.vocab_used)
