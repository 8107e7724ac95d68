"""A quantized weight as a checkpoint ships it -> the ``Packed`` every other
part reads (``quantize.Packed``: codes, and f32 scales per group and output
column), with its scales checked: the loaders of models/shipped_view.py call
``from_shipped`` once per tensor, and nothing shipped reaches the kernel
without passing through it.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from megakernel.errors import ConfigError
from megakernel.formats import Format
from megakernel.quantize import Packed


def e8m0_scales(exponent_bytes: np.ndarray) -> np.ndarray:
    """E8M0 bytes (1..254; 0 and 255 are refused by the loaders) -> f32 2^(b - 127)."""
    return np.exp2(np.asarray(exponent_bytes, np.float32) - 127).astype(np.float32)


def from_shipped(fmt: Format, codes: np.ndarray, scales: np.ndarray, name: str,
                 dtype: str = "bfloat16", *, codes_name: str = "",
                 transposed: bool = False, global_scale=None, global_name: str = "",
                 global_divides: bool = False) -> Packed:
    """A weight as a checkpoint ships it, in the IR's [..., K, N] orientation:
    ``codes`` (int8 values; e4m3 or e2m1 bit patterns as uint8, or a float8
    array) and ``scales`` as shipped (int8/int4: [..., K/g, N]; fp8_b128: f32
    [..., ceil(K/128), ceil(N/128)]; mxfp4: E8M0 bytes [..., K/32, N];
    nvfp4: e4m3 [..., K/16, N], as float8 or their bytes, with
    ``global_scale``, the f32 scale of the matrix, or of each leading index:
    s = block x global, or block / global where the checkpoint stores its
    reciprocal (``global_divides``: compressed-tensors), in f32 as its own
    dequantization computes it).
    Malformed scales are a ``ConfigError`` naming the tensor ``name``: a zero,
    NaN or infinite scale, an E8M0 byte 0 or 255 (not a usable power of two);
    for nvfp4 a NaN or negative block scale (a zero one is a block of zeros)
    and a global scale that is not finite and positive (``global_name``);
    NaN e4m3 codes name ``codes_name`` (default ``name``). ``transposed``: the
    arrays are a checkpoint's [..., out, in] tensors transposed, so an error
    gives the index of the bad scale in the tensor as stored."""
    codes = np.asarray(codes)
    if codes.dtype == ml_dtypes.float8_e4m3fn:
        codes = codes.view(np.uint8)
    k, n = codes.shape[-2:]
    want = fmt.scale_shape(codes.shape)
    if tuple(scales.shape) != want:
        raise ConfigError(f"scales have shape {tuple(scales.shape)}, expected {want} for "
                          f"{fmt.name} codes of shape {tuple(codes.shape)}", path=name)
    if fmt.scale == "e8m0":
        raw = np.asarray(scales).astype(np.int64)
        bad = (raw <= 0) | (raw >= 255)
        what = "E8M0 bytes 0 or 255"
    elif fmt.scale == "float8_e4m3fn":
        raw = np.asarray(scales)
        raw = (raw.view(ml_dtypes.float8_e4m3fn) if raw.dtype == np.uint8 else raw).astype(
            np.float32)
        bad = ~np.isfinite(raw) | (raw < 0)
        what = "NaN or negative e4m3 block scales"
    else:
        raw = np.asarray(scales, np.float32)
        bad = ~np.isfinite(raw) | (raw == 0)
        what = "zero, NaN or infinite scales"
    if bad.any():
        first = tuple(int(i) for i in np.argwhere(bad)[0])
        stored = (*first[:-2], first[-1], first[-2]) if transposed else first
        raise ConfigError(f"{int(bad.sum())} {what} (first at {list(stored)}: "
                          f"{raw[first].item()!r})", path=name,
                          hint="the checkpoint's scales are corrupt or not of this format")
    if fmt.code == "float8_e4m3fn" and ((codes & 0x7F) == 0x7F).any():
        raise ConfigError("float8 e4m3 codes hold NaN (0x7f / 0xff)", path=codes_name or name,
                          hint="the checkpoint's codes are corrupt")
    if fmt.scale == "e8m0":
        s = e8m0_scales(raw)
    elif fmt.scale == "float8_e4m3fn":
        s = _globally_scaled(raw, global_scale, global_name or name, global_divides)
    elif fmt.group_cols > 1:            # block scales, repeated over their columns
        s = np.repeat(raw, fmt.group_cols, axis=-1)[..., :n]
    else:
        s = raw
    return Packed(fmt, codes, s.astype(np.float32), dtype)


def _globally_scaled(blocks: np.ndarray, glob, name: str, divides: bool) -> np.ndarray:
    """NVFP4's f32 scales: e4m3 ``blocks`` [..., K/16, N] (as f32) times, or
    divided by, the global scale of their matrix (one, or one per leading
    index); a missing, misshapen, non-finite or non-positive one names ``name``."""
    if glob is None:
        raise ConfigError("nvfp4 block scales need the weight's global scale", path=name,
                          hint="the checkpoint is incomplete")
    g = np.asarray(glob, np.float32)
    lead = blocks.shape[:-2]
    if g.size == 1:
        g = g.reshape(())
    elif g.reshape(-1).shape != (int(np.prod(lead)),) or not lead:
        raise ConfigError(f"global scale has shape {list(g.shape)}, expected one value"
                          f"{' or ' + str(list(lead)) if lead else ''}", path=name)
    else:
        g = g.reshape(lead)
    if not (np.isfinite(g) & (g > 0)).all():
        raise ConfigError(f"global scale {g.reshape(-1)[0].item()!r} is not a finite positive "
                          "number", path=name, hint="the checkpoint's scales are corrupt")
    g = g[..., None, None]
    return (blocks / g if divides else blocks * g).astype(np.float32)
