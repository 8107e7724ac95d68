"""Hugging Face ``deepseek_v3`` (and ``kimi_k2``, the same architecture) import.

``IMPORTERS`` turns a config.json into card fields (models/hf.py calls it):
multi-head latent attention (``mla``), DeepSeek routing (sigmoid scores, a
selection-only correction bias, group-limited top-k, renormalisation, then the
routed scaling), shared experts and the first ``first_k_dense_replace`` layers
dense, with default or YaRN rope. Facts: tests/fixtures/hf/README.md, "DeepSeek-V3".

``checkpoint_names(config, model)`` maps the checkpoint's tensors onto the IR's
weights (models/checkpoint_families.py), with three conversions (``RULES``,
which models/checkpoint.py applies):

* ``kv_b_proj`` [H*(dn+dv), R], rows per head ``k_nope_h | v_h``, is split
  into the MLA op's ``w_uk`` [H*dn, R] and ``w_uv`` [R, H*dv];
* with ``rope_interleave`` (the class default, and what DeepSeek's and Kimi's
  own code do) the rope rows of ``q_b_proj`` / ``q_proj`` (each head's last dr)
  and of ``kv_a_proj_with_mqa`` (its last dr) are permuted evens-then-odds, so
  the IR's rotate-half RoPE gives the interleaved rotation's scores, and the
  cached k_pe is de-interleaved exactly as Hugging Face caches it;
* the multi-token-prediction layers (``num_nextn_predict_layers``, stored as
  ``model.layers.{L}.*`` and up) are left out, as ``DeepseekV3ForCausalLM``
  leaves them out: they only draft tokens and do not change the logits.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from megakernel.errors import ConfigError, shown
from megakernel.ir import limits
from megakernel.ir.config import MLAConfig, MoEConfig
from megakernel.models.checkpoint_names import Source, _attn_mlp, _moe
from megakernel.models.hf_fields import ACTIVATIONS, REQUIRED, FieldReader
from megakernel.models.hf_rope import read_rope

def _harmless(r: FieldReader) -> None:
    """Keys that never change the decode maths, type-checked all the same:
    training-only losses, an expert-parallel layout hint, the remote-code map
    (never run), the multi-token-prediction layers (left out), and
    rope_interleave (the loader's weight permutation reads it)."""
    r.get("aux_loss_alpha", float, None, low=0.0, high=1e3)
    r.get("seq_aux", bool, None)
    r.get("ep_size", int, None, low=1, high=limits.MAX_EXPERTS)
    for key in ("num_nextn_predict_layers", "num_mtp_layers"):
        r.get(key, int, None, low=0, high=64)
    r.get("rope_interleave", bool, None)
    code = r.get("auto_map", dict, None)
    if code is not None and not all(isinstance(v, str) for v in code.values()):
        r.problem("auto_map", "should map names to module paths (strings)")


def import_fields(r: FieldReader) -> dict[str, Any]:
    """Card fields of a deepseek_v3 / kimi_k2 config (problems recorded in ``r``)."""
    size = lambda key, high, default=REQUIRED: r.get(key, int, default, low=1, high=high)  # noqa: E731
    heads = size("num_attention_heads", limits.MAX_HEADS)
    kv_heads = size("num_key_value_heads", limits.MAX_HEADS, heads)
    if heads and kv_heads and kv_heads != heads:
        r.problem("num_key_value_heads", f"{kv_heads} differs from num_attention_heads="
                  f"{heads}; MLA expands one latent into every head's K and V")
    dn = size("qk_nope_head_dim", limits.MAX_HEAD_DIM, 128) or 1
    dr = size("qk_rope_head_dim", limits.MAX_HEAD_DIM, 64) or 2
    dv = size("v_head_dim", limits.MAX_HEAD_DIM, 128) or 1
    for key, want in (("head_dim", dr), ("qk_head_dim", dn + dr)):
        found = r.get(key, int, None)
        # transformers writes both, derived from the rope and nope dims
        if found is not None and found != want:
            r.problem(key, f"{found} differs from {want}, the value derived from "
                      "qk_nope_head_dim and qk_rope_head_dim")
    rq = r.get("q_lora_rank", int, 0, low=1, high=limits.MAX_WIDTH)
    mla = MLAConfig(kv_lora_rank=size("kv_lora_rank", limits.MAX_WIDTH, 512) or 1,
                    qk_nope_head_dim=dn, qk_rope_head_dim=dr, v_head_dim=dv,
                    q_lora_rank=rq or 0)
    bias = r.get("attention_bias", bool, False)
    act = r.get("hidden_act", str, "silu")
    if act not in ACTIVATIONS:
        r.problem("hidden_act", f"{shown(act)} is not supported; supported: {sorted(ACTIVATIONS)}")
    fields = dict(
        vocab_size=size("vocab_size", limits.MAX_VOCAB), hidden_size=size("hidden_size",
                                                                          limits.MAX_WIDTH),
        num_layers=size("num_hidden_layers", limits.MAX_LAYERS), num_q_heads=heads,
        num_kv_heads=heads, head_dim=dn + dr,
        intermediate_size=size("intermediate_size", limits.MAX_WIDTH),
        activation=ACTIVATIONS.get(act, "silu"),
        norm_eps=r.get("rms_norm_eps", float, 1e-6, low=limits.NORM_EPS[0],
                       high=limits.NORM_EPS[1]),
        tie_embeddings=r.get("tie_word_embeddings", bool, False),
        qkv_bias=bias, o_bias=bias, mla=mla)
    fields.update(read_rope(r, 10000.0))
    if fields.get("rope_scaling", {}).get("rope_type", "yarn") != "yarn":
        r.problem("rope_scaling", "only default and yarn rope are supported for MLA")
        fields.pop("rope_scaling")
    fields.update(_routing(r, fields.get("num_layers") or 0))
    _harmless(r)
    return fields


def _routing(r: FieldReader, layers: int) -> dict[str, Any]:
    """DeepSeek's MoE: the card's moe block and first_k_dense (HF: layer i is MoE
    iff i >= first_k_dense_replace; moe_layer_freq must be 1)."""
    experts = r.get("n_routed_experts", int, None, low=1, high=limits.MAX_EXPERTS)
    first = r.get("first_k_dense_replace", int, 0, low=0, high=limits.MAX_LAYERS)
    freq = r.get("moe_layer_freq", int, 1, low=1)
    if freq != 1:
        r.problem("moe_layer_freq", f"{freq}: only every layer from first_k_dense_replace on "
                  "being MoE (1) is supported (transformers ignores this key)")
    for key, want in (("scoring_func", "sigmoid"), ("topk_method", "noaux_tc")):
        found = r.get(key, str, want)
        if found != want:
            r.problem(key, f"{shown(found)} is not supported; DeepSeek-V3 routing is "
                      f"{want!r} (V2's softmax / greedy routing is not)")
    top_k = r.get("num_experts_per_tok", int, 8, low=1, high=limits.MAX_EXPERTS) or 1
    width = r.get("moe_intermediate_size", int, 2048, low=1, high=limits.MAX_WIDTH) or 1
    shared = r.get("n_shared_experts", int, 0, low=0, high=limits.MAX_SHARED_EXPERTS) or 0
    groups = r.get("n_group", int, 1, low=1, high=limits.MAX_EXPERTS) or 1
    topk_groups = r.get("topk_group", int, 1, low=1, high=limits.MAX_EXPERTS) or 1
    scaling = r.get("routed_scaling_factor", float, 1.0, low=0.0, high=1e3, open_low=True)
    renorm = r.get("norm_topk_prob", bool, True)
    if experts is None or first >= layers:
        return {}
    return {"moe": MoEConfig(experts, top_k, width, "sigmoid", correction_bias=True,
                             renormalize=renorm, routed_scaling=scaling or 1.0,
                             num_shared_experts=shared, shared_intermediate=width if shared else 0,
                             n_group=groups, topk_group=topk_groups if groups > 1 else 1),
            "first_k_dense": first}


IMPORTERS = {"deepseek_v3": import_fields, "kimi_k2": import_fields}


# ---- checkpoint names ----------------------------------------------------------

def rope_permutation(dr: int) -> np.ndarray:
    """Feature order evens-then-odds of one rope part of dr features."""
    return np.concatenate([np.arange(0, dr, 2), np.arange(1, dr, 2)])


def _q_rows(files, name, spec, heads: int, dn: int, dr: int, interleave: bool):
    """q_b_proj / q_proj [H*(dn+dr), in] -> [in, H*(dn+dr)], rope part permuted."""
    w = _expect_T(files, name, spec)
    if interleave:
        per = w.reshape(w.shape[0], heads, dn + dr)
        per = np.concatenate([per[..., :dn], per[..., dn:][..., rope_permutation(dr)]], -1)
        w = per.reshape(w.shape)
    return w


def _kv_a(files, name, spec, rank: int, dr: int, interleave: bool):
    """kv_a_proj_with_mqa [R+dr, D] -> [D, R+dr], the k_pe rows permuted."""
    w = _expect_T(files, name, spec)
    if interleave:
        w = np.concatenate([w[:, :rank], w[:, rank:][:, rope_permutation(dr)]], -1)
    return w


def _kv_b(files, name, spec, heads: int, dn: int, dv: int, part: str):
    """kv_b_proj [H*(dn+dv), R] -> w_uk [H*dn, R] or w_uv [R, H*dv]."""
    rank = files.shape(name)[-1]
    want = (heads * (dn + dv), rank)
    if files.shape(name) != want:
        raise ConfigError(f"{name} has shape {list(files.shape(name))}, expected {list(want)}",
                          path="checkpoint")
    per = files.get(name).reshape(heads, dn + dv, rank)
    if part == "k":
        return per[:, :dn].reshape(heads * dn, rank)
    return per[:, dn:].reshape(heads * dv, rank).T


def _expect_T(files, name, spec):
    if files.shape(name) != tuple(spec.shape[::-1]):
        raise ConfigError(f"{name} has shape {list(files.shape(name))}, expected "
                          f"{list(spec.shape[::-1])}", path="checkpoint")
    return files.get(name).T


RULES = {"deepseek_q": _q_rows, "deepseek_kv_a": _kv_a, "deepseek_kv_b": _kv_b}


def checkpoint_names(config: dict, model) -> dict:
    """IR layer weight suffix -> HF sources (models/checkpoint_names.py ``Source``)."""
    op = next(n.op for n in model.layers[0].nodes if n.op.kind == "mla")
    heads, dn, dr, dv = op.num_heads, op.nope_dim, op.rope_dim, op.v_head_dim
    interleave = config.get("rope_interleave", True) is not False
    base = _attn_mlp()
    a = "self_attn."
    t = {k: base[k] for k in ("input_norm.weight", "post_norm.weight", "mlp.gate", "mlp.up",
                              "mlp.down")}
    t.update({
        "q_a_proj.weight": (Source(a + "q_a_proj.weight", "T"),),
        "q_a_proj.bias": (Source(a + "q_a_proj.bias"),),
        "q_a_norm.weight": (Source(a + "q_a_layernorm.weight"),),
        "q_b_proj.weight": (Source(a + "q_b_proj.weight", "deepseek_q",
                                   (heads, dn, dr, interleave)),),
        "q_proj.weight": (Source(a + "q_proj.weight", "deepseek_q", (heads, dn, dr, interleave)),),
        "kv_a_proj.weight": (Source(a + "kv_a_proj_with_mqa.weight", "deepseek_kv_a",
                                    (op.kv_lora_rank, dr, interleave)),),
        "mla.kv_norm": (Source(a + "kv_a_layernorm.weight"),),
        "mla.w_uk": (Source(a + "kv_b_proj.weight", "deepseek_kv_b", (heads, dn, dv, "k")),),
        "mla.w_uv": (Source(a + "kv_b_proj.weight", "deepseek_kv_b", (heads, dn, dv, "v")),),
        "o_proj.weight": (Source(a + "o_proj.weight", "T"),),
        "o_proj.bias": (Source(a + "o_proj.bias"),),
    })
    t.update(_moe(("mlp.gate.weight",),
                  {p: f"mlp.experts.{{e}}.{p}_proj.weight" for p in ("gate", "up", "down")},
                  ("mlp.experts",)))
    t["moe.router_bias"] = (Source("mlp.gate.e_score_correction_bias"),)
    for p in ("gate", "up", "down"):
        t[f"moe.shared_{p}"] = (Source(f"mlp.shared_experts.{p}_proj.weight", "T"),)
    return t


def ignored_prefixes(config: dict) -> tuple[str, ...]:
    """The multi-token-prediction layers' tensors (left out of the model)."""
    layers = config.get("num_hidden_layers")
    extra = config.get("num_nextn_predict_layers", config.get("num_mtp_layers", 0))
    if not isinstance(layers, int) or not isinstance(extra, int) or extra < 0:
        return ()
    return tuple(f"model.layers.{layers + j}." for j in range(min(extra, 64)))
