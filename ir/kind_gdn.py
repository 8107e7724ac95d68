"""Gated DeltaNet (GDN): the linear-attention mixer of Qwen3.5 and Qwen3-Next.

One op takes the six raw projections of a token (q, k, v, z, b, a; the
``linear`` ops before it make them, so everything the sharding sees is
contiguous per head) and returns the gated-normed heads that ``out_proj``
reads. Per token, per value head h (key head ``h // (HV / HK)``):

    c      = silu(depthwise causal conv of the last ``conv_kernel`` raw q|k|v rows)
    q, k   = l2norm(c_q) * key_dim**-0.5, l2norm(c_k)        (eps 1e-6 inside the sum)
    beta   = sigmoid(b_h);  g = -exp(A_log_h) * softplus(a_h + dt_bias_h)
    S      = exp(g) S;  S += k (beta (v - S^T k))^T;  o = S^T q     (S [key_dim, value_dim], f32)
    y      = rmsnorm(o) * norm_weight * silu(z)                    (plain weight, not 1 + w)

State kept between steps (``state``): the raw (pre-conv) q, k and v rows of
the last ``conv_kernel - 1`` tokens (``hist_q``, ``hist_k``, ``hist_v``; the
conv taps are the weights ``conv_q``, ``conv_k``, ``conv_v``), and the recurrent state S of every value
head in float32, each read whole and written whole every step.
"""

from __future__ import annotations

from typing import ClassVar

from megakernel.errors import IRError
from megakernel.ir import limits, sizes
from megakernel.ir.blocks import norm, residual
from megakernel.ir.card import MIXERS, Mixer
from megakernel.ir.op_base import OP_KINDS, Linear, Op, _expect_shapes
from megakernel.ir.op_fields import HeadDim, Heads
from megakernel.ir.weight_kinds import WEIGHT_KINDS
from megakernel.ir.schema import Float, Int, node
from megakernel.ir.types import WHOLE, DType, ParamSpec, StateSpec

# The fixed epsilon of the q/k L2 norm (HF's l2norm in the delta rule, fla's default).
L2_EPS = 1e-6


@node
class GatedDeltaNet(Op):
    """Inputs q [HK*dk], k [HK*dk], v [HV*dv], z [HV*dv], b [HV], a [HV] per
    token; output [HV*dv]. ``norm_eps`` is the gated norm's epsilon."""

    kind: ClassVar[str] = "gated_deltanet"
    LIBRARY: ClassVar[str | None] = "gdn"
    STATE_ACCESS: ClassVar[frozenset[str]] = frozenset({WHOLE})
    num_key_heads: Heads
    num_value_heads: Heads
    key_dim: HeadDim
    value_dim: HeadDim
    conv_kernel: Int(2, limits.MAX_CONV_KERNEL) = 4
    norm_eps: Float(*limits.NORM_EPS) = 1e-6

    def __post_init__(self):
        if self.num_value_heads % self.num_key_heads:
            raise IRError(f"num_value_heads={self.num_value_heads} is not a multiple of "
                          f"num_key_heads={self.num_key_heads} (each key head serves a "
                          "whole group of value heads)")

    @property
    def group(self) -> int:
        """Value heads per key head (consecutive value heads share one)."""
        return self.num_value_heads // self.num_key_heads

    @property
    def key_width(self) -> int:
        return self.num_key_heads * self.key_dim

    @property
    def value_width(self) -> int:
        return self.num_value_heads * self.value_dim

    def widths(self) -> dict[str, int]:
        """Per-token width of each input, by the name of its conv section or gate."""
        kw, vw, hv = self.key_width, self.value_width, self.num_value_heads
        return {"q": kw, "k": kw, "v": vw, "z": vw, "b": hv, "a": hv}

    def params(self, dtype):
        kc, hv = self.conv_kernel, self.num_value_heads
        # A_log and dt_bias stay float32 whatever the model dtype (HF keeps the
        # SSM parameters in float32: mamba_ssm_dtype).
        return {"conv_q": ParamSpec((kc, self.key_width), dtype),
                "conv_k": ParamSpec((kc, self.key_width), dtype),
                "conv_v": ParamSpec((kc, self.value_width), dtype),
                "A_log": ParamSpec((hv,), DType.F32),
                "dt_bias": ParamSpec((hv,), DType.F32),
                "norm": ParamSpec((self.value_dim,), dtype)}

    def state(self, batch, max_seq_len, dtype):
        hist = self.conv_kernel - 1
        return {"hist_q": StateSpec((batch, hist, self.key_width), dtype, WHOLE),
                "hist_k": StateSpec((batch, hist, self.key_width), dtype, WHOLE),
                "hist_v": StateSpec((batch, hist, self.value_width), dtype, WHOLE),
                "recurrent": StateSpec((batch, self.num_value_heads, self.key_dim,
                                        self.value_dim), DType.F32, WHOLE)}

    def infer(self, inputs):
        _expect_shapes(self, inputs, tuple((w,) for w in self.widths().values()))
        return ((self.value_width,),)


OP_KINDS.register(GatedDeltaNet.kind)(GatedDeltaNet)
# Its conv taps and per-head vectors are not matmul weights: all plain.
WEIGHT_KINDS.register(GatedDeltaNet.kind)(lambda op: {})


def _gdn_block(c, b, x: str) -> str:
    """The card's Gated DeltaNet mixer (``MIXERS['linear_attention']``): input
    norm, six projections, the recurrence, out_proj and the residual add."""
    la, h = c.linear_attention, c.hidden_size
    hn = b.add("input_norm", norm(c, h), (x,), "h_attn") if c.pre_norms else x
    kw, vw, hv = (la.num_key_heads * la.key_head_dim, la.num_value_heads * la.value_head_dim,
                  la.num_value_heads)
    ins = tuple(b.add(f"{p}_proj", lambda w=w: Linear(h, w), (hn,), f"gdn_{p}")
                for p, w in (("q", kw), ("k", kw), ("v", vw), ("z", vw), ("b", hv), ("a", hv)))
    o = b.add("gdn", lambda: GatedDeltaNet(la.num_key_heads, la.num_value_heads,
                                           la.key_head_dim, la.value_head_dim,
                                           la.conv_kernel, c.norm_eps), ins, "gdn_out")
    o = b.add("out_proj", lambda: Linear(vw, h), (o,), "attn_out")
    return residual(c, b, x, o, "attn", "x_mid")


def _gdn_sizes(c) -> tuple[int, int]:
    """(weights, state bytes of one sequence) of one Gated DeltaNet mixer: its
    block norms, the six projections, out_proj, conv taps and gated-norm weight
    (A_log and dt_bias float32); conv histories and the f32 recurrent state."""
    la, h, item = c.linear_attention, c.hidden_size, sizes.item_size(c)
    kw, vw, hv = (la.num_key_heads * la.key_head_dim, la.num_value_heads * la.value_head_dim,
                  la.num_value_heads)
    gdn = (sizes.block_norms(c) + h * (2 * kw + 2 * vw + 2 * hv) + vw * h
           + la.conv_kernel * (2 * kw + vw))
    state = ((la.conv_kernel - 1) * (2 * kw + vw) * item
             + hv * la.key_head_dim * la.value_head_dim * 4)
    return (gdn + la.value_head_dim) * item + 2 * hv * 4, state


MIXERS.register("linear_attention")(Mixer("linear", _gdn_block, _gdn_sizes))
