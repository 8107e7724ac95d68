"""The ``Feature.add`` of the table's card options that need more than a
value (strategies.py): NoPE layer types, which must name the card's own
rotary layer types, and padding ids, which depend on the vocabulary."""

from __future__ import annotations

import dataclasses

from hypothesis import strategies as st

from megakernel.ir.card import MIXERS, ModelConfig


def rotary_mixers(card: ModelConfig) -> list[str]:
    """The card's layer types that rotate q and k (so may be NoPE), in order."""
    kinds = dict.fromkeys(card.mixer(i) for i in range(card.num_layers))
    return [k for k in kinds if MIXERS(k).rotary]


def add_nope(draw, card: ModelConfig, cores: int) -> ModelConfig:
    """The last, or every one, of the card's rotary layer types without RoPE
    (Muse Spark: its full-attention layers)."""
    kinds = rotary_mixers(card)
    chosen = draw(st.sampled_from([kinds[-1:], kinds]))
    return dataclasses.replace(card, nope_layer_types=tuple(chosen))


def add_vocab_used(draw, card: ModelConfig, cores: int) -> ModelConfig:
    """A few padding ids, or half the vocabulary (a whole core's columns on 2)."""
    pad = draw(st.sampled_from([3, card.vocab_size // 2]))
    return dataclasses.replace(card, vocab_used=card.vocab_size - pad)
