"""The keys only some Hugging Face families have, read into card fields.

One reader per family row of ``hf.FAMILIES`` (its ``extras``); each takes the
``FieldReader`` and the fields read so far and returns more card fields. What
a key means is checked against transformers 5.24 (tests/fixtures/hf/README.md,
"Facts checked").
"""

from __future__ import annotations

from typing import Any

from megakernel.ir import limits
from megakernel.ir.config import MoEConfig
from megakernel.models.hf_fields import FieldReader

_CAP = dict(low=0.0, high=limits.MAX_SCALE, open_low=True)


def _cap(r: FieldReader, key: str, default: float | None) -> float | None:
    """A soft-cap: absent -> the class default; an explicit null switches it off."""
    if key in r.data and r.data[key] is None:
        r.mark_used(key)
        return None
    return r.get(key, float, default, **_CAP)


def _query_scale(r: FieldReader) -> dict[str, Any]:
    # Gemma scales scores by query_pre_attn_scalar^-1/2, not head_dim^-1/2.
    q = r.get("query_pre_attn_scalar", float, 256.0, low=0.0, high=limits.MAX_WIDTH,
              open_low=True)
    return {"softmax_scale": q ** -0.5} if q else {}


def _gemma2(r: FieldReader, fields: dict) -> dict[str, Any]:
    r.get("cache_implementation", str, None)     # a generation-cache choice, same maths
    return {**_query_scale(r), "attn_logit_softcap": _cap(r, "attn_logit_softcapping", 50.0),
            "final_logit_softcap": _cap(r, "final_logit_softcapping", 30.0)}


def _gemma3(r: FieldReader, fields: dict) -> dict[str, Any]:
    # Gemma3Attention never passes attn_logit_softcapping on: the key has no effect.
    r.get("attn_logit_softcapping", float, None, **_CAP)
    r.get("cache_implementation", str, None)
    if r.get("use_bidirectional_attention", bool, False):
        r.problem("use_bidirectional_attention", "true is not supported (a decoder "
                  "attends causally; the bidirectional window is another model)")
    return {**_query_scale(r), "final_logit_softcap": _cap(r, "final_logit_softcapping", None)}


def _gpt_oss(r: FieldReader, fields: dict) -> dict[str, Any]:
    # The original release also writes the context YaRN was trained from
    # (rope_scaling carries it as original_max_position_embeddings).
    r.get("initial_context_length", int, None, low=1, high=limits.MAX_SEQ_LEN)
    return {"attention_sinks": True}


def gpt_oss_moe(r: FieldReader, fields: dict) -> MoEConfig:
    """gpt-oss routing: top-k of the biased router logits, softmax over those k
    (= softmax over all, renormalised over the k), biased clamped-SwiGLU experts
    of width ``intermediate_size``."""
    experts = r.get("num_local_experts", int, 128, low=1, high=limits.MAX_EXPERTS) or 1
    top_k = r.get("num_experts_per_tok", int, 4, low=1, high=limits.MAX_EXPERTS) or 1
    also = r.get("experts_per_token", int, None, low=1, high=limits.MAX_EXPERTS)
    if also is not None and also != top_k:
        r.problem("experts_per_token", f"{also} differs from num_experts_per_tok={top_k}")
    limit = r.get("swiglu_limit", float, 7.0, **_CAP)
    alpha = r.get("swiglu_alpha", float, 1.702, **_CAP)
    return MoEConfig(experts, top_k, fields.get("intermediate_size") or 1, "softmax",
                     renormalize=True, router_logit_bias=True, expert_bias=True,
                     swiglu_limit=limit, swiglu_alpha=alpha or 1.702)


def _phi3(r: FieldReader, fields: dict) -> dict[str, Any]:
    # Only longrope scaling reads the original context, and longrope is refused.
    r.get("original_max_position_embeddings", int, None, low=1, high=limits.MAX_SEQ_LEN)
    for key in ("embd_pdrop", "resid_pdrop"):        # dropout: identity at inference
        r.get(key, float, 0.0, low=0.0, high=1.0)
    return {}


EXTRAS = {"gemma2": _gemma2, "gemma3": _gemma3, "gpt_oss": _gpt_oss, "phi3": _phi3}
