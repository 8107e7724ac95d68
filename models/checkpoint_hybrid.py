"""Checkpoint names of the hybrid linear-attention families (qwen3_5, qwen3_5_text,
qwen3_next): the rows of ``checkpoint_names.NAMES`` and the rules that cut fused
HF tensors into the IR's contiguous-per-head weights (tests/fixtures/hf/README.md).

* Gated DeltaNet, Qwen3.5: ``in_proj_qkv`` rows are flat ``q | k | v`` (heads
  in order); ``in_proj_z``, ``in_proj_b``, ``in_proj_a`` are separate.
* Gated DeltaNet, Qwen3-Next: ``in_proj_qkvz`` rows are grouped per key head
  g, ``q_g (dk) | k_g (dk) | v_g (r dv) | z_g (r dv)``, and ``in_proj_ba`` rows
  ``b_g (r) | a_g (r)`` (r = value heads per key head); value head g r + j.
* Both: ``conv1d.weight`` [q|k|v channels, 1, Kc] becomes three [Kc, C] tap
  tables; ``A_log``, ``dt_bias``, ``norm.weight`` are copied.
* Gated full attention: ``q_proj`` rows are per head ``[query (hd) | gate (hd)]``,
  split into the IR's ``q_proj`` and ``gate_proj``.
* Qwen3-Next MoE: the shared expert and its [1, H] sigmoid gate.
"""

from __future__ import annotations

import numpy as np

from megakernel.errors import ConfigError
from megakernel.models.checkpoint_names import (IGNORED_PREFIXES, LAYER_PREFIX, NAMES, PREFIXES,
                                                Source, _attn_mlp, _moe)


def _gdn(layer):
    return layer.node("gdn").op


def _rows(files, name, expected: tuple[int, ...]) -> np.ndarray:
    """The HF tensor ``name``, checked to have ``expected`` shape."""
    found = files.shape(name)
    if found != tuple(expected):
        raise ConfigError(f"{name} has shape {list(found)}, expected {list(expected)}",
                          path="checkpoint")
    return files.get(name)


def _flat_qkv(part: str):
    """q, k or v rows of Qwen3.5's flat in_proj_qkv [2 HK dk + HV dv, H], as [H, C]."""
    def rule(files, name, spec, layer):
        op = _gdn(layer)
        kw, vw = op.key_width, op.value_width
        w = _rows(files, name, (2 * kw + vw, spec.shape[0]))
        start, width = {"q": (0, kw), "k": (kw, kw), "v": (2 * kw, vw)}[part]
        return w[start:start + width].T
    return rule


def _grouped_qkvz(part: str):
    """q, k, v or z rows of Qwen3-Next's in_proj_qkvz, grouped per key head, as [H, C]."""
    def rule(files, name, spec, layer):
        op = _gdn(layer)
        hk, dk, rdv = op.num_key_heads, op.key_dim, op.group * op.value_dim
        w = _rows(files, name, (hk * (2 * dk + 2 * rdv), spec.shape[0]))
        g = w.reshape(hk, 2 * dk + 2 * rdv, -1)
        start, width = {"q": (0, dk), "k": (dk, dk), "v": (2 * dk, rdv),
                        "z": (2 * dk + rdv, rdv)}[part]
        return g[:, start:start + width].reshape(hk * width, -1).T
    return rule


def _grouped_ba(part: str):
    """b or a rows of Qwen3-Next's in_proj_ba [HK * 2r, H], grouped per key head."""
    def rule(files, name, spec, layer):
        op = _gdn(layer)
        hk, r = op.num_key_heads, op.group
        g = _rows(files, name, (hk * 2 * r, spec.shape[0])).reshape(hk, 2 * r, -1)
        half = g[:, :r] if part == "b" else g[:, r:]
        return half.reshape(hk * r, -1).T
    return rule


def _conv(part: str):
    """The [Kc, C] taps of the q, k or v channels of conv1d.weight [2 HK dk + HV dv, 1, Kc]."""
    def rule(files, name, spec, layer):
        op = _gdn(layer)
        kw, vw = op.key_width, op.value_width
        w = _rows(files, name, (2 * kw + vw, 1, op.conv_kernel))[:, 0, :]
        start, width = {"q": (0, kw), "k": (kw, kw), "v": (2 * kw, vw)}[part]
        return w[start:start + width].T
    return rule


def _gated_q(half: int):
    """Query (0) or gate (1) half of each head of the gated q_proj [H 2 hd, hidden]
    (or of its bias [H 2 hd])."""
    def rule(files, name, spec, layer):
        op = layer.node("attention").op
        heads, hd = op.num_q_heads, op.head_dim
        if len(spec.shape) == 1:
            b = _rows(files, name, (2 * heads * hd,)).reshape(heads, 2, hd)
            return b[:, half].reshape(-1)
        w = _rows(files, name, (2 * heads * hd, spec.shape[0])).reshape(heads, 2, hd, -1)
        return w[:, half].reshape(heads * hd, -1).T
    return rule


def _shared_expert_gate(files, name, spec, layer):
    return _rows(files, name, (1, spec.shape[0]))[0]


# The rules that need the IR layer (models/checkpoint.py reads them):
# (files, name, spec, layer) -> array.
LAYER_RULES = {
    **{f"qkv_{p}": _flat_qkv(p) for p in "qkv"},
    **{f"qkvz_{p}": _grouped_qkvz(p) for p in "qkvz"},
    **{f"ba_{p}": _grouped_ba(p) for p in "ba"},
    **{f"conv_{p}": _conv(p) for p in "qkv"},
    "gated_query": _gated_q(0), "gated_gate": _gated_q(1),
    "shared_expert_gate": _shared_expert_gate,
}


def _hybrid(moe: bool) -> dict[str, tuple[Source, ...]]:
    la = "linear_attn."
    t = _attn_mlp()
    # q_proj: a full-attention layer's gated q_proj, or a GDN layer's fused input.
    t["q_proj.weight"] = (Source("self_attn.q_proj.weight", "gated_query"),
                          Source(la + "in_proj_qkv.weight", "qkv_q"),
                          Source(la + "in_proj_qkvz.weight", "qkvz_q"))
    t["q_proj.bias"] = (Source("self_attn.q_proj.bias", "gated_query"),)
    t["gate_proj.weight"] = (Source("self_attn.q_proj.weight", "gated_gate"),)
    t["gate_proj.bias"] = (Source("self_attn.q_proj.bias", "gated_gate"),)
    t["k_proj.weight"] += (Source(la + "in_proj_qkv.weight", "qkv_k"),
                           Source(la + "in_proj_qkvz.weight", "qkvz_k"))
    t["v_proj.weight"] += (Source(la + "in_proj_qkv.weight", "qkv_v"),
                           Source(la + "in_proj_qkvz.weight", "qkvz_v"))
    t["z_proj.weight"] = (Source(la + "in_proj_z.weight", "T"),
                          Source(la + "in_proj_qkvz.weight", "qkvz_z"))
    for p in "ba":
        t[f"{p}_proj.weight"] = (Source(f"{la}in_proj_{p}.weight", "T"),
                                 Source(la + "in_proj_ba.weight", f"ba_{p}"))
    for p in "qkv":
        t[f"gdn.conv_{p}"] = (Source(la + "conv1d.weight", f"conv_{p}"),)
    t["gdn.A_log"] = (Source(la + "A_log"),)
    t["gdn.dt_bias"] = (Source(la + "dt_bias"),)
    t["gdn.norm"] = (Source(la + "norm.weight"),)
    t["out_proj.weight"] = (Source(la + "out_proj.weight", "T"),)
    if moe:
        t.update(_moe(("mlp.gate.weight",),
                      {p: f"mlp.experts.{{e}}.{p}_proj.weight" for p in ("gate", "up", "down")},
                      ("mlp.experts",)))
        for p in ("gate", "up", "down"):
            t[f"moe.shared_{p}"] = (Source(f"mlp.shared_expert.{p}_proj.weight", "T"),)
        t["moe.shared_expert_gate"] = (Source("mlp.shared_expert_gate.weight",
                                              "shared_expert_gate"),)
    return t


NAMES.update({"qwen3_5": _hybrid(False), "qwen3_5_text": _hybrid(False),
              "qwen3_next": _hybrid(True)})
# Published Qwen3.5 checkpoints are vision-language: the text layers live under
# model.language_model; the vision tower and the MTP head are not read.
for _t in ("qwen3_5", "qwen3_5_text"):
    PREFIXES[_t] = (LAYER_PREFIX, "model.language_model.layers.{i}.")
    IGNORED_PREFIXES[_t] = ("model.visual.", "visual.", "mtp.", "model.mtp.")
IGNORED_PREFIXES["qwen3_next"] = ("mtp.", "model.mtp.")
del _t
