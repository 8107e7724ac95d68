"""Quantize a weight into its format, pack it into words, and decode it: the
one arithmetic the reference and the kernel share.

Host side (numpy, once at load): ``quantize(fmt, w)`` rounds a float
[..., K, N] weight to a ``Packed`` (codes + scales). Rounding is
round-to-nearest, ties to even, per format:

* int8: per output column s = bf16(max|w| / 127), q = clip(rint(w / s), -127, 127);
* int4_g: per group of g inputs and column s = bf16(max|w| / 7),
  q = clip(rint(w / s), -8, 7);
* fp8_b128: per 128 x 128 block s = max|w| / 448 (f32), q = e4m3(w / s) (ml_dtypes'
  round-to-nearest-even cast);
* mxfp4 (OCP MX v1.0): per 32 inputs and column the shared exponent
  E = floor(log2(max|w|)) - 2 (2 = e2m1's largest exponent), s = 2^E stored as
  the E8M0 byte E + 127, q = e2m1(w / s) rounded to nearest even and saturated
  to +-6;
* nvfp4 (NVIDIA's recipe, as llm-compressor writes it): per matrix (each
  expert's own) the global scale 1/G = 6 x 448 / max|w| (f32), so every block
  scale fits e4m3; per 16 inputs and column b = e4m3((max|w| / 6) / G), at
  least e4m3's smallest subnormal 2^-9, s = b / (1/G) (f32), q = e2m1(w / s)
  rounded to nearest even, saturated to +-6.

An all-zero group gets scale 1 (E8M0 byte 127; nvfp4's b = 1). ``Packed.scales`` are always
per output column, [..., K / g, N] f32 (fp8's per-128-column block scales are
repeated over their columns, int8's single row is [..., 1, N]), so slicing
columns for a core never cuts a scale.

Kernel side (jnp, traced inside the Pallas kernel and in the reference):
codes travel as 32-bit words, ``UNIT`` rows of codes to 8 word rows: in a unit,
byte (8-bit codes) or nibble (4-bit codes) i of word row j is code row 8 i + j,
so ``decode`` turns 8 word rows into whole rows with signed int32 shifts and
masks only (no unsigned vector op, no sub-word reshape) and stacks them along
the sublanes. ``dequantize`` = decode, times the scale of each row's group, in
f32, cast to the model dtype: the reference calls it on whole matrices, the
kernel on each streamed tile, so both see the same bf16 weights.

Formats the MXU takes as float8 (``Format.mxu == "fp8"``: fp8_b128, mxfp4,
int4) are not dequantised: their words are a plain bitcast of the codes
(``to_words``), the kernel feeds each group to the MXU as float8
(backends/pallas_tpu/kernels/dequant.py) and multiplies the dot's output columns by
the group's scales, and the reference computes the same
sum_g (x_g @ codes_g) * s_g (``models/reference.py`` ``ScaledCodes``): the
products are exact in f32 either way, so only the order of f32 sums differs.
int8 (``Format.mxu == "scaled"``) likewise: its words are a plain bitcast, the
kernel converts each chunk's codes to the model dtype (exact) for the dot and
multiplies the summed [B, N] output by the per-column scales, and the
reference's ``ScaledCodes`` (one group) does the same.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import ml_dtypes
import numpy as np

from megakernel.formats import WHOLE, Format

WORD_ROWS = 8          # word rows of one unit: one [8, 128] int32 tile
# MXU paths whose words are a plain bitcast of the codes (``pltpu.bitcast``
# reads them in the kernel): float8 operands, and int8 scaled after the dot.
BITCAST_PATHS = ("fp8", "scaled")
E2M1_MAGNITUDES = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], np.float32)


def unit_rows(fmt: Format) -> int:
    """Code rows per unit of ``WORD_ROWS`` word rows (32 for 8-bit, 64 for 4-bit)."""
    return WORD_ROWS * 32 // fmt.code_bits


@dataclass(frozen=True)
class Packed:
    """A quantized weight: ``codes`` [..., K, N] (int8 values of int8/int4;
    uint8 bit patterns of e4m3 / e2m1), ``scales`` [..., K / g, N] float32.
    ``fmt`` names its format."""

    fmt: Format
    codes: np.ndarray
    scales: np.ndarray
    dtype: str = "bfloat16"      # what it dequantises to (the model dtype)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.codes.shape)

    @property
    def nbytes(self) -> int:
        return self.fmt.hbm_bytes(self.shape, 0)

    def group(self) -> int:
        return self.codes.shape[-2] // self.scales.shape[-2]

    def cut(self, region: tuple[slice, ...], shape: tuple[int, ...], where: str) -> "Packed":
        """The block ``region`` of the weight, zero-padded to ``shape`` (a core's
        shard); a cut through a scale group along the inputs is a named error."""
        from megakernel.errors import ShardingError

        k_axis = len(self.shape) - 2
        rows = region[k_axis]
        k_pad = shape[k_axis]
        if self.fmt.group_rows == WHOLE:      # one scale row serves any rows
            s_region = (*region[:k_axis], slice(0, 1), *region[k_axis + 1:])
            s_shape = (*shape[:k_axis], 1, *shape[k_axis + 1:])
            return Packed(self.fmt, _padded(self.codes[region], shape),
                          _padded(self.scales[s_region], s_shape), self.dtype)
        g = self.group()
        if rows.start % g or (rows.stop % g and rows.stop != self.shape[k_axis]) or k_pad % g:
            raise ShardingError(f"rows {rows.start}..{rows.stop} (padded to {k_pad}) of a "
                                f"{self.fmt.name} weight cut its scale groups of {g} inputs",
                                path=where, hint="use another core count or format")
        s_region = (*region[:k_axis], slice(rows.start // g, -(-rows.stop // g)),
                    *region[k_axis + 1:])
        s_shape = (*shape[:k_axis], k_pad // g, *shape[k_axis + 1:])
        return Packed(self.fmt, _padded(self.codes[region], shape),
                      _padded(self.scales[s_region], s_shape), self.dtype)


def _padded(a: np.ndarray, shape) -> np.ndarray:
    pads = [(0, want - have) for want, have in zip(shape, a.shape)]
    return np.pad(a, pads) if any(hi for _, hi in pads) else np.ascontiguousarray(a)


def _groups(w: np.ndarray, g: int) -> np.ndarray:
    """[..., K, N] -> [..., K/g, g, N]."""
    *lead, k, n = w.shape
    return w.reshape(*lead, k // g, g, n)


def _amax(w: np.ndarray, g: int) -> np.ndarray:
    return np.abs(_groups(w, g)).max(axis=-2)          # [..., K/g, N]


def _spread(s: np.ndarray, g: int) -> np.ndarray:
    """Scales [..., K/g, N] -> one per row [..., K, N]."""
    return np.repeat(s, g, axis=-2)


def quantize(fmt: Format, w: np.ndarray, dtype: str = "bfloat16") -> Packed:
    """``w`` [..., K, N] (float) rounded to ``fmt`` (module docstring);
    ``dtype``: what the kernel and reference dequantise it to."""
    return dataclasses.replace(_quantize(fmt, np.asarray(w, np.float32)), dtype=dtype)


def _quantize(fmt: Format, w: np.ndarray) -> Packed:
    k, n = w.shape[-2:]
    g = k if fmt.group_rows == WHOLE else fmt.group_rows
    if fmt.code == "int8" or fmt.code == "int4":
        top = 127 if fmt.code == "int8" else 7
        low = -127 if fmt.code == "int8" else -8
        s = _amax(w, g) / top
        s = np.where(s == 0, 1.0, s).astype(ml_dtypes.bfloat16).astype(np.float32)
        q = np.clip(np.rint(w / _spread(s, g)), low, top).astype(np.int8)
        return Packed(fmt, q, s)
    if fmt.code == "float8_e4m3fn":
        cols = fmt.group_cols
        pad = -n % cols
        wp = np.pad(w, [(0, 0)] * (w.ndim - 1) + [(0, pad)])
        *lead, _, npad = wp.shape
        blocks = np.abs(wp.reshape(*lead, k // g, g, npad // cols, cols)).max(axis=(-3, -1))
        s = (blocks / 448.0).astype(np.float32)
        s = np.where(s == 0, np.float32(1.0), s)
        s = np.repeat(s, cols, axis=-1)[..., :n]            # per column
        q = (w / _spread(s, g)).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
        return Packed(fmt, q, s)
    if fmt.code == "float4_e2m1fn" and fmt.scale == "float8_e4m3fn":
        return Packed(fmt, *_nvfp4(w, g))
    if fmt.code == "float4_e2m1fn":
        amax = _amax(w, g)
        e = np.where(amax > 0, np.floor(np.log2(np.where(amax > 0, amax, 1.0))) - 2, 0)
        e = np.clip(e, -126, 127)
        s = np.exp2(e).astype(np.float32)
        x = np.clip(w / _spread(s, g), -6.0, 6.0)
        q = x.astype(ml_dtypes.float4_e2m1fn).view(np.uint8) & 0xF
        return Packed(fmt, q, s)
    raise ValueError(f"format {fmt.name!r} has no quantizer")


def _e2m1(x: np.ndarray) -> np.ndarray:
    """e2m1 bit patterns (uint8, sign in bit 3) of ``x``, rounded to nearest
    even and saturated to +-6."""
    return np.clip(x, -6.0, 6.0).astype(ml_dtypes.float4_e2m1fn).view(np.uint8) & 0xF


E4M3_MAX, E2M1_MAX = 448.0, 6.0


def _nvfp4(w: np.ndarray, g: int) -> tuple[np.ndarray, np.ndarray]:
    """(codes, f32 scales) of ``w`` [..., K, N] in NVFP4 (module docstring),
    in f32 step by step as llm-compressor rounds, so a checkpoint it wrote
    and quantize-on-load of the same weights hold the same codes and scales."""
    f32 = np.float32
    top = np.abs(w).max(axis=(-2, -1), keepdims=True).astype(f32)   # one per matrix
    inv = np.where(top > 0, f32(E2M1_MAX * E4M3_MAX) / np.where(top > 0, top, 1), 1).astype(f32)
    amax = _amax(w, g).astype(f32)
    b = ((amax / f32(E2M1_MAX)) * inv).astype(ml_dtypes.float8_e4m3fn).astype(f32)
    b = np.where(amax > 0, np.maximum(b, f32(2.0 ** -9)), 1).astype(f32)
    s = (b / inv).astype(f32)
    return _e2m1(w / _spread(s, g)), s


def decode_np(p: Packed) -> np.ndarray:
    """Code values as float32 [..., K, N] (an independent numpy decode, for tests)."""
    if p.fmt.code in ("int8", "int4"):
        return p.codes.astype(np.float32)
    if p.fmt.code == "float8_e4m3fn":
        return p.codes.view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    sign = np.where(p.codes & 8, -1.0, 1.0).astype(np.float32)
    return sign * E2M1_MAGNITUDES[p.codes & 7]


# ---- words: the HBM and VMEM layout of codes ------------------------------------

def to_words(p: Packed) -> np.ndarray:
    """codes [..., K, N] -> int32 [..., K / per, N] in units (module docstring);
    codes fed to the MXU as float8 (``Format.mxu == "fp8"``) or int8 codes
    scaled after the dot (``"scaled"``) as a plain bitcast instead: word row r holds code rows per r .. per r + per - 1, the
    first in the lowest bits (``pltpu.bitcast``'s order along the
    second-minor axis)."""
    bits = p.fmt.code_bits
    if p.fmt.mxu in BITCAST_PATHS:
        *lead, k, n = p.codes.shape
        per = 32 // bits
        raw = (p.codes.astype(np.int64) & ((1 << bits) - 1)).reshape(*lead, k // per, per, n)
        shifts = (np.arange(per, dtype=np.int64) * bits).reshape(per, 1)
        words = (raw << shifts).sum(axis=-2)
        return np.where(words >= 2**31, words - 2**32, words).astype(np.int32)
    per, unit = 32 // bits, unit_rows(p.fmt)
    *lead, k, n = p.codes.shape
    raw = p.codes.astype(np.int64) & ((1 << bits) - 1)
    u = raw.reshape(*lead, k // unit, per, WORD_ROWS, n)        # [.., U, i, j, N]
    shifts = (np.arange(per, dtype=np.int64) * bits).reshape(per, 1, 1)
    words = (u << shifts).sum(axis=-3)                           # [.., U, j, N]
    words = np.where(words >= 2**31, words - 2**32, words)
    return words.reshape(*lead, k // per, n).astype(np.int32)


def decode(fmt: Format, words, mxu: str | None = None):
    """int32 words [8 U, N] (whole units) -> code values f32 [U * unit, N],
    with signed int32 shifts and masks only (usable inside the kernel).
    ``mxu``: the path whose word layout ``words`` has (default the format's
    own, ``to_words``); the calibration decodes each path's own layout."""
    import jax
    import jax.numpy as jnp

    bits, per = fmt.code_bits, 32 // fmt.code_bits
    rows, n = words.shape
    planes = []
    for i in range(per):
        # field i moved to the top bits, then an arithmetic shift down: the
        # sign-extended field; masking gives the raw (unsigned) bit pattern.
        top = jnp.left_shift(words, 32 - bits * (i + 1)) if i < per - 1 else words
        field = jnp.right_shift(top, 32 - bits)
        planes.append(field if fmt.code in ("int8", "int4")
                      else jnp.bitwise_and(field, (1 << bits) - 1))
    if (mxu or fmt.mxu) in BITCAST_PATHS:   # field i of word row r is code row per r + i
        codes = jnp.stack(planes, axis=1).reshape(rows * per, n)
    else:
        codes = jnp.concatenate([p.reshape(rows // WORD_ROWS, WORD_ROWS, n) for p in planes],
                                axis=1).reshape(rows * per, n)
    if fmt.code in ("int8", "int4"):
        return codes.astype(jnp.float32)
    if fmt.code == "float8_e4m3fn":
        sign = jnp.right_shift(codes, 7)                       # 0 or 1
        exp = jnp.bitwise_and(jnp.right_shift(codes, 3), 15)
        man = jnp.bitwise_and(codes, 7)
        normal = jax.lax.bitcast_convert_type(
            jnp.left_shift(exp + 120, 23) + jnp.left_shift(man, 20), jnp.float32)
        mag = jnp.where(exp == 0, man.astype(jnp.float32) * (2.0 ** -9), normal)
        return jnp.where(sign == 1, -mag, mag)
    # e2m1: sign bit 3, exponent bits 2..1, mantissa bit 0
    exp = jnp.bitwise_and(jnp.right_shift(codes, 1), 3)
    man = jnp.bitwise_and(codes, 1)
    normal = jax.lax.bitcast_convert_type(
        jnp.left_shift(exp + 126, 23) + jnp.left_shift(man, 22), jnp.float32)
    mag = jnp.where(exp == 0, man.astype(jnp.float32) * 0.5, normal)
    return jnp.where(jnp.bitwise_and(codes, 8) != 0, -mag, mag)


def dequantize(fmt: Format, words, scales, dtype, mxu: str | None = None):
    """words [8 U, N] and f32 scales [rows / g, N] -> weights [rows, N] in
    ``dtype``: code x scale of its group, in f32, then rounded to ``dtype``
    (``mxu``: as ``decode``)."""
    import jax.numpy as jnp

    codes = decode(fmt, words, mxu)
    rows, n = codes.shape
    groups = scales.shape[0]
    g = rows // groups
    w = codes.reshape(groups, g, n) * scales.reshape(groups, 1, n).astype(jnp.float32)
    return w.reshape(rows, n).astype(dtype)


def dequantize_packed(p: Packed, dtype=None):
    """The whole weight through ``dequantize`` (the reference's view of it),
    in ``dtype`` (default: the model dtype it was quantized for)."""
    import jax.numpy as jnp

    dtype = dtype or jnp.dtype(p.dtype)

    words = to_words(p)
    *lead, kw, n = words.shape
    w = words.reshape(-1, kw, n)
    s = p.scales.reshape(-1, *p.scales.shape[-2:])
    out = [dequantize(p.fmt, jnp.asarray(w[i]), jnp.asarray(s[i]), dtype)
           for i in range(w.shape[0])]
    return jnp.stack(out).reshape(*lead, kw * 32 // p.fmt.code_bits, n)


def quantize_weights(model, weights: dict, dtype=None) -> dict:
    """``weights`` (float, names as ``Model.params()``) with every weight whose
    format is not plain rounded to it (``quantize``): quantize-on-load, for
    random init and bf16/f32 checkpoints alike. They dequantise to ``dtype``
    (a ``DType``; default the model's)."""
    from megakernel import formats

    out = dict(weights)
    for name, spec in model.params().items():
        fmt = formats.get(spec.format)
        if not fmt.plain and not isinstance(out[name], Packed):
            out[name] = quantize(fmt, np.asarray(out[name], np.float32),
                                 (dtype or model.dtype).value)
    return out
