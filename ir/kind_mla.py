"""Multi-head latent attention (MLA), DeepSeek-V2/V3's and Kimi's attention.

Per token, with H heads, latent rank R, per-head query/key widths dn (no
position) + dr (rotary) and value width dv (models-wave2.md section 3):

    q            = the query projection's output, per head [q_nope (dn) | q_pe (dr)]
    kv_a         = x @ W_kv_a, split [c_kv (R) | k_pe (dr)]
    c_kv         = RMSNorm(c_kv) (``kv_norm``, eps ``kv_norm_eps``)
    q_pe, k_pe   = RoPE(q_pe), RoPE(k_pe): rotate-half over the dr features,
                   YaRN-scaled (none when ``rope`` is false: Kimi's NoPE MLA)
    k_nope_h     = c_kv @ w_uk[h].T   (w_uk [H*dn, R], head h's rows h*dn..)
    v_h          = c_kv @ w_uv[:, h]  (w_uv [R, H*dv], head h's columns h*dv..)
    score_{h,t}  = (q_nope_h . k_nope_{h,t} + q_pe_h . k_pe_t) * softmax_scale
    out_h        = softmax_t(score) . v_h        (causal over the latent cache)
    out          = out * sigmoid(gate)           (with ``output_gate``, Kimi K3)

k_pe is one head shared by every head. The op keeps ONE appended state,
``latent`` [B, S, R + dr]: c_kv after its norm and k_pe after RoPE, per token,
shared by all heads (576 values per token at DeepSeek-V3's sizes). The query
path (q_a, its norm, q_b, or one q projection), the kv_a projection and the
output projection are ordinary ``linear`` / ``rmsnorm`` ops around this one.

Hugging Face's kv_b_proj [H*(dn+dv), R] holds per head rows ``k_nope_h | v_h``;
the loader splits it into w_uk and w_uv. DeepSeek's RoPE rotates interleaved
pairs (2i, 2i+1); the loader permutes the rope rows of q_b and kv_a to
evens-then-odds, after which rotate-half computes the same scores and the cache
holds k_pe de-interleaved, as Hugging Face's cache does (models/hf_deepseek.py).
"""

from __future__ import annotations

import math
from typing import ClassVar

from megakernel.errors import IRError
from megakernel.ir import limits, sizes
from megakernel.ir.blocks import norm, residual
from megakernel.ir.card import MIXERS, Mixer
from megakernel.ir.kind_rmsnorm import RMSNorm
from megakernel.ir.op_base import OP_KINDS, Linear, Op, _expect_shapes
from megakernel.ir.op_fields import Dim, HeadDim, Heads
from megakernel.ir.rope_scaling import RopeScaling, rope_attention_factor, rope_inv_freq
from megakernel.ir.weight_kinds import WEIGHT_KINDS
from megakernel.ir.schema import Bool, Float, node
from megakernel.ir.types import APPEND, ParamSpec, StateSpec


@node
class MLA(Op):
    """Multi-head latent attention over a latent cache (see the module docstring).

    Inputs q [H*(dn+dr)], kv_a [R+dr] (and gate [H*dv] with ``output_gate``);
    output [H*dv]. ``softmax_scale`` 0 means (dn+dr)^-1/2 times YaRN's
    ``softmax_mscale()``."""

    kind: ClassVar[str] = "mla"
    LIBRARY: ClassVar[str | None] = "mla"
    STATE_ACCESS: ClassVar[frozenset[str]] = frozenset({APPEND})
    num_heads: Heads
    kv_lora_rank: Dim
    nope_dim: HeadDim
    rope_dim: HeadDim
    v_head_dim: HeadDim
    softmax_scale: Float(*limits.SOFTMAX_SCALE) = 0.0
    rope: Bool = True
    theta: Float(*limits.ROPE_THETA, open_low=True) = 10000.0
    scaling: RopeScaling | None = None
    kv_norm_eps: Float(*limits.NORM_EPS) = 1e-6
    output_gate: Bool = False

    def __post_init__(self):
        if self.rope_dim % 2:
            raise IRError(f"rope_dim={self.rope_dim} must be even (rotated in pairs)",
                          path=self.kind)
        if not self.rope and self.scaling is not None:
            raise IRError("scaling is set but rope=false (NoPE): nothing is rotated",
                          path=self.kind, hint="remove scaling or set rope to true")
        if self.softmax_scale == 0:
            m = self.scaling.softmax_mscale() if self.scaling is not None else 1.0
            object.__setattr__(self, "softmax_scale",
                               m / math.sqrt(self.nope_dim + self.rope_dim))

    @property
    def qk_head_dim(self) -> int:
        return self.nope_dim + self.rope_dim

    @property
    def latent_dim(self) -> int:
        """Values per token in the latent cache: R + dr."""
        return self.kv_lora_rank + self.rope_dim

    def inv_freq(self):
        """Per-pair inverse frequencies of the rope part [dr // 2], float64."""
        return rope_inv_freq(self.theta, self.rope_dim, self.scaling)

    def attention_factor(self) -> float:
        """What cos and sin are multiplied by (YaRN's attention scaling; else 1)."""
        return rope_attention_factor(self.scaling)

    def params(self, dtype):
        h, r = self.num_heads, self.kv_lora_rank
        return {"kv_norm": ParamSpec((r,), dtype),
                "w_uk": ParamSpec((h * self.nope_dim, r), dtype),
                "w_uv": ParamSpec((r, h * self.v_head_dim), dtype)}

    def state(self, batch, max_seq_len, dtype):
        return {"latent": StateSpec((batch, max_seq_len, self.latent_dim), dtype, APPEND)}

    def infer(self, inputs):
        expected = [(self.num_heads * self.qk_head_dim,), (self.latent_dim,)]
        if self.output_gate:
            expected.append((self.num_heads * self.v_head_dim,))
        _expect_shapes(self, inputs, tuple(expected))
        return ((self.num_heads * self.v_head_dim,),)


OP_KINDS.register(MLA.kind)(MLA)
# The absorbed up-projections, read by the MLA library itself.
WEIGHT_KINDS.register(MLA.kind)(lambda op: {"w_uk": "attention", "w_uv": "attention"})


def _mla_block(c, b, x: str) -> str:
    """The card's MLA mixer (``MIXERS['mla']``): input norm, the query path
    (q_a -> norm -> q_b, or one q projection), kv_a, optional gate projection,
    the MLA op, the output projection and the residual add."""
    m = _mla_config(c)
    # Card fields of GQA attention that MLA has no place for: refused, not ignored.
    unused = {"qk_norm": c.qk_norm, "rotary_dim": c.rotary_dim,
              "sliding_window": c.sliding_window if c.layer_types is None else None,
              "attn_logit_softcap": c.attn_logit_softcap,
              "attention_sinks": c.attention_sinks,
              "sliding_rope_theta": c.sliding_rope_theta if c.layer_types is None else None,
              "attn_output_norm": c.attn_output_norm if c.layer_types is None else None}
    for field, value in unused.items():
        if value:
            raise IRError(f"{field}={value} does not apply to MLA layers", path=field,
                          hint=f"remove {field}, or give layer_types with attention layers")
    h, heads = c.hidden_size, c.num_q_heads
    dn, dr, dv, r = m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim, m.kv_lora_rank
    hn = b.add("input_norm", norm(c, h), (x,), "h_attn") if c.pre_norms else x
    if m.q_lora_rank:
        rq = m.q_lora_rank
        q = b.add("q_a_proj", lambda: Linear(h, rq, c.qkv_bias), (hn,), "q_a")
        q = b.add("q_a_norm", lambda: RMSNorm(rq, m.latent_norm_eps), (q,), "q_a_normed")
        q = b.add("q_b_proj", lambda: Linear(rq, heads * (dn + dr)), (q,), "q")
    else:
        q = b.add("q_proj", lambda: Linear(h, heads * (dn + dr), c.qkv_bias), (hn,), "q")
    kv = b.add("kv_a_proj", lambda: Linear(h, r + dr, c.qkv_bias), (hn,), "kv_a")
    inputs = (q, kv)
    if m.output_gate:
        inputs += (b.add("gate_proj", lambda: Linear(h, heads * dv), (hn,), "gate"),)
    o = b.add("mla", lambda: MLA(heads, r, dn, dr, dv, c.softmax_scale, m.rope, c.rope_theta,
                                 c.rope_scaling if m.rope else None, m.latent_norm_eps,
                                 m.output_gate), inputs, "attn")
    o = b.add("o_proj", lambda: Linear(heads * dv, h, c.o_bias), (o,), "attn_out")
    return residual(c, b, x, o, "attn", "x_mid")


def _mla_config(c):
    if c.mla is None:
        raise IRError("the mixer is 'mla' but the card has no mla block", path="mla",
                      hint="add an mla block (kv_lora_rank, qk_nope_head_dim, "
                           "qk_rope_head_dim, v_head_dim)")
    return c.mla


def _mla_sizes(c) -> tuple[int, int]:
    """(weights, latent-cache bytes of one sequence) of one MLA mixer: its block
    norms, q path, kv_a, optional gate, kv_norm, w_uk, w_uv, o."""
    m, h, heads, item = _mla_config(c), c.hidden_size, c.num_q_heads, sizes.item_size(c)
    dn, dr, dv, r = m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim, m.kv_lora_rank
    qk = heads * (dn + dr)
    if m.q_lora_rank:
        query = h * m.q_lora_rank + m.q_lora_rank + m.q_lora_rank * qk
        query += m.q_lora_rank * c.qkv_bias
    else:
        query = h * qk + qk * c.qkv_bias
    params = (query + h * (r + dr) + (r + dr) * c.qkv_bias + r + heads * dn * r
              + r * heads * dv + heads * dv * h + h * c.o_bias)
    params += h * heads * dv * m.output_gate
    return (sizes.block_norms(c) + params) * item, c.max_seq_len * (r + dr) * item


MIXERS.register("mla")(Mixer("mla", _mla_block, _mla_sizes))
