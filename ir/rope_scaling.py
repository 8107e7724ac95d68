"""Rotary-embedding frequency scaling: the ``RopeScaling`` record and the
frequencies and attention factor it gives.

After import: ``rope_inv_freq`` gives the per-pair inverse frequencies of a
rotary embedding (llama3, linear or YaRN scaling applied, float64) and
``rope_attention_factor`` what its cos and sin are multiplied by; both are
shared by the ``Rope`` op (ir/kind_attention.py) and DeepSeek's MLA
(ir/kind_mla.py). ir/ops.py re-exports them.
"""

from __future__ import annotations

import math
from typing import ClassVar, Literal

import numpy as np

from megakernel.ir import limits
from megakernel.ir.op_fields import FreqFactor, Positions, _fail
from megakernel.ir.schema import Bool, Float, node


@node
class RopeScaling:
    """Frequency scaling of rotary embeddings. ``llama3``: Llama 3.1+ smooth
    wavelength-dependent scaling; ``linear``: positions divided by ``factor``;
    ``yarn``: YaRN's ramp between interpolated and original frequencies
    (``beta_fast``/``beta_slow`` rotations, rounded outward when ``truncate``),
    with cos and sin multiplied by ``rope_attention_factor``: ``attention_factor``
    if set, else g(factor, mscale) / g(factor, mscale_all_dim) when both are
    set, else g(factor) = 0.1 ln(factor) + 1 (Hugging Face's rule). DeepSeek's
    MLA also multiplies its softmax scale by ``softmax_mscale()``."""

    rope_type: Literal["llama3", "linear", "yarn"]
    factor: Float(*limits.ROPE_FACTOR, open_low=True)
    low_freq_factor: FreqFactor = 1.0
    high_freq_factor: FreqFactor = 4.0
    original_max_position: Positions = 8192
    beta_fast: FreqFactor = 32.0
    beta_slow: FreqFactor = 1.0
    truncate: Bool = True
    attention_factor: Float(0.0, limits.ROPE_FACTOR[1]) = 0.0
    mscale: Float(0.0, limits.MAX_SCALE) = 0.0            # 0: absent
    mscale_all_dim: Float(0.0, limits.MAX_SCALE) = 0.0    # 0: absent

    SUPPORTED: ClassVar[tuple[str, ...]] = ("llama3", "linear", "yarn")

    def __post_init__(self):
        if self.rope_type == "llama3" and not self.high_freq_factor > self.low_freq_factor:
            raise _fail("high_freq_factor",
                        f"high_freq_factor={self.high_freq_factor} must exceed "
                        f"low_freq_factor={self.low_freq_factor}")

    def softmax_mscale(self) -> float:
        """DeepSeek's multiplier of the attention softmax scale: m^2 with
        m = 0.1 * mscale_all_dim * ln(factor) + 1 under YaRN, else 1."""
        if self.rope_type != "yarn" or not self.mscale_all_dim:
            return 1.0
        return _yarn_mscale(self.factor, self.mscale_all_dim) ** 2


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def rope_attention_factor(s: "RopeScaling | None") -> float:
    """What cos and sin are multiplied by (YaRN's attention scaling; else 1)."""
    if s is None or s.rope_type != "yarn":
        return 1.0
    if s.attention_factor:
        return s.attention_factor
    if s.mscale and s.mscale_all_dim:
        return _yarn_mscale(s.factor, s.mscale) / _yarn_mscale(s.factor, s.mscale_all_dim)
    return _yarn_mscale(s.factor)


def rope_inv_freq(theta: float, rotary_dim: int, s: "RopeScaling | None") -> np.ndarray:
    """Per-pair inverse frequencies [rotary_dim // 2], float64, scaling applied."""
    rd = rotary_dim
    inv = 1.0 / (theta ** (np.arange(0, rd, 2, dtype=np.float64) / rd))
    if s is None:
        return inv
    if s.rope_type == "linear":
        return inv / s.factor
    if s.rope_type == "yarn":
        return _yarn_inv_freq(inv, s, rd, theta)
    # llama3: long wavelengths slowed by `factor`, short ones kept, a smooth
    # blend in between (Llama 3.1 reference implementation's equations).
    wavelen = 2 * math.pi / inv
    low_wl = s.original_max_position / s.low_freq_factor
    high_wl = s.original_max_position / s.high_freq_factor
    smooth = (s.original_max_position / wavelen - s.low_freq_factor) / (
        s.high_freq_factor - s.low_freq_factor)
    blended = (1 - smooth) * inv / s.factor + smooth * inv
    return np.where(wavelen > low_wl, inv / s.factor,
                    np.where(wavelen < high_wl, inv, blended))


def _yarn_inv_freq(inv: np.ndarray, s: RopeScaling, rd: int, theta: float) -> np.ndarray:
    """YaRN (transformers' _compute_yarn_parameters): pair i keeps its frequency
    below rotation count ``beta_fast``'s dimension, is divided by ``factor``
    above ``beta_slow``'s, and is blended linearly in between."""
    def dim_of(rotations: float) -> float:
        return rd * math.log(s.original_max_position / (rotations * 2 * math.pi)) / (
            2 * math.log(theta))

    lo, hi = dim_of(s.beta_fast), dim_of(s.beta_slow)
    if s.truncate:
        lo, hi = math.floor(lo), math.ceil(hi)
    lo, hi = max(lo, 0), min(hi, rd - 1)
    if lo == hi:
        hi += 0.001         # as transformers does, so the ramp has a width
    ramp = np.clip((np.arange(rd // 2, dtype=np.float64) - lo) / (hi - lo), 0.0, 1.0)
    keep = 1.0 - ramp       # 1: original frequency (extrapolation), 0: interpolated
    return inv / s.factor * (1.0 - keep) + inv * keep
