"""How the card draw (strategies.py) adds the latent MoE's options to a drawn
MoE card (ir/kind_moe.py): the latent projections, an expert output norm,
and Muse Spark's router. Each ``add_*`` is a ``Feature.add``: (draw, card,
cores) -> the card with it, valid at ``cores`` whatever else was drawn."""

from __future__ import annotations

import dataclasses

from hypothesis import strategies as st


def _moe(card, **fields):
    return dataclasses.replace(card, moe=dataclasses.replace(card.moe, **fields))


def add_latent(draw, card, cores):
    """Experts at a latent width of whole 128-lane tiles, its input normed on a coin."""
    return _moe(card, latent_size=draw(st.sampled_from([128, 256])),
                latent_input_norm=draw(st.booleans()))


def add_expert_norm(draw, card, cores):
    """A norm of each expert's output (input-scaled on a coin) or of their
    weighted sum; the per-expert one (normed after the picks' all-reduce)
    splits the experts over ``cores`` any way the card allows."""
    form = draw(st.sampled_from(["weighted_sum", "per_expert"]))
    scaled = form == "per_expert" and draw(st.booleans())
    return _moe(card, expert_output_norm=form, expert_output_norm_input_scaled=scaled,
                expert_output_norm_eps=draw(st.sampled_from([None, 1e-8])))


def add_muse_router(draw, card, cores):
    """An f32 router, its logits scaled, renormalisation with an epsilon."""
    return _moe(card, router_f32=True, router_logit_scale=draw(st.sampled_from([2 ** -2.5, 0.5])),
                renormalize_eps=1e-15 if card.moe.renormalize else 0.0)
