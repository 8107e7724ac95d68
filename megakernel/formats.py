"""The table of weight formats: how one weight matrix is stored in HBM, what
its scales are, and what a streamed tile of it must hold.

A format is per-parameter data (``ParamSpec.format``), chosen per *weight
kind* by the card's ``quantize`` table (``{"experts": "mxfp4", "dense":
"int8"}``; unnamed kinds stay ``plain``, the model dtype). Matrices are
stored [in, out] = [K, N] (experts [E, K, N]); scales group along the input
dimension K, so a tile that is a block of K rows carries whole groups.

| format | codes | scales (shape as shipped) | bits/weight shipped | in the kernel's HBM |
|---|---|---|---|---|
| plain | model dtype | none | 16 (bf16) | 16 |
| int8 | int8, symmetric | bf16 per output channel, [1, N] | 8 + 16/K | 8 + 32/K |
| int4_g{32,64,128} | int4 in [-8, 7] | bf16 per g inputs, [K/g, N] | 4 + 16/g | 4 + 32/g |
| fp8_b128 | float8 e4m3fn | f32 per 128 x 128 block, [K/128, N/128] | 8 + 32/16384 | 8 + 32/128 |
| mxfp4 | e2m1 (4 bits) | E8M0 byte per 32 inputs, [K/32, N] | 4 + 8/32 | 4 + 32/32 |
| nvfp4 | e2m1 (4 bits) | e4m3 per 16 inputs, [K/16, N], and one f32 per tensor | 4 + 8/16 | 4 + 32/16 |

NVFP4's per-tensor f32 (global) scale is folded into its block scales when the
weight is read (``shipped_scales.from_shipped``): the kernel streams one f32 scale
per 16 inputs and output column, like every other format's.

The kernel's operands hold the scales as f32, one per group and output column
(``streamed_scale_shape``), streamed through the ring beside their codes.

How a tile sits in VMEM (``vmem_rows``): codes stay packed in 32-bit words
(the ring's banks are words, ``compiler/ring_layout.py``): 8-bit codes four
rows to a word row, 4-bit codes eight rows to a word row, so a VMEM bank
holds a 4-bit tile at half a byte per weight, not the byte per element a
``jnp.int4`` buffer would take (pltpu tiles int4 and e2m1 as [64, 128]: a
64-row block of codes is exactly one [8, 128] tile of words, the row quantum
below). The kernel unpacks words with signed int32 shifts and masks only
(``megakernel/quantize.py``), except for formats whose codes go to the MXU
as float8 (``mxu="fp8"``; TPU7x takes a bf16 x float8 dot at twice the bf16
weight rate): fp8_b128 as they are, MXFP4's e2m1 turned into e4m3 bits
exactly (value x 2^-6), int4 c as the e4m3 byte u = c + 8 (value u x 2^-9,
exact: subnormals 0-7, then the first normal binade; the offset comes off
each group's dot as 8 rowsum(x_g)). Their words are a plain bitcast of the
codes, and each group's dot is scaled after it. int8 (``mxu="scaled"``)
also ships a plain bitcast: its codes are converted to bf16 (exact) for a
bf16-rate dot, and its per-column scale multiplies the output. Which path a format takes is
measured: ``megakernel calibrate`` runs every format through each of its
``mxu_paths`` and a test holds ``mxu`` to the fastest (docs/formats.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from megakernel.errors import IRError

# Per output channel: one group spans the whole input dimension.
WHOLE = 0
# Codes whose values the MXU can take exactly as float8 e4m3 operands, each by
# bitwise ops on the words (backends/pallas_tpu/kernels/dequant.py ``_float8``).
FP8_CODES = ("float8_e4m3fn", "float4_e2m1fn", "int4")
# Codes exact in bf16 whose per-output-column scale can wait for the dot's
# output (``mxu="scaled"``; dequant.py ``_scaled_after``).
SCALED_CODES = ("int8",)


@dataclass(frozen=True)
class Format:
    name: str
    code: str           # element type of the codes ("" = plain: the model dtype)
    code_bits: int      # 0 for plain
    group_rows: int     # input rows sharing one scale (WHOLE: all of them)
    group_cols: int     # output columns sharing one scale as shipped (fp8: 128)
    scale: str          # storage of the scales: "bfloat16", "float32", "e8m0", "float8_e4m3fn"
    scale_bits: int
    about: str
    # How the codes reach the MXU: "dequant" (decoded, times their scales, in
    # the model dtype), "fp8" (as float8 e4m3 operands, exactly; each group's
    # scales multiply the dot's output columns: x @ W = sum_g (x_g @ codes_g) s_g)
    # or "scaled" (int8, per output column: the codes decoded to the model dtype,
    # exactly, and the scale multiplies the dot's [B, N] output after the whole
    # K sweep, x @ (q s) = (x @ q) s, instead of the [K, N] weights before it).
    mxu: str = "dequant"

    @property
    def plain(self) -> bool:
        return self.code_bits == 0

    @property
    def mxu_paths(self) -> tuple[str, ...]:
        """Every path the kernel has for these codes (``dequant.matmul``), the
        format's own (``mxu``) first; ``megakernel calibrate`` measures each."""
        paths = ("dequant", "fp8") if self.code in FP8_CODES else ("dequant",)
        if self.code in SCALED_CODES and self.group_rows == WHOLE:
            paths += ("scaled",)
        return (self.mxu, *(p for p in paths if p != self.mxu)) if not self.plain else ()

    @property
    def code_rows(self) -> int:
        """Rows of one native VMEM tile of the codes: [32, 128] for 8-bit codes,
        [64, 128] for 4-bit ones (pltpu's sublane tiling of int8 / int4), i.e.
        eight 32-bit word rows either way."""
        return 8 * 32 // self.code_bits

    def group(self, k: int) -> int:
        """Input rows per scale for a matrix of ``k`` input rows."""
        return k if self.group_rows == WHOLE else self.group_rows

    def row_quantum(self, k: int) -> int:
        """Rows a streamed tile of a [k, n] matrix must be a multiple of (whole
        code tiles and whole scale groups); per-channel scales do not cut K."""
        if self.plain:
            return 1
        if self.group_rows == WHOLE:
            return self.code_rows
        return math.lcm(self.code_rows, self.group_rows)

    def scale_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """Shape of the scales of a [..., K, N] weight, as shipped."""
        *lead, k, n = shape
        return (*lead, k // self.group(k), -(-n // self.group_cols))

    def code_bytes(self, shape: tuple[int, ...]) -> int:
        return math.prod(shape) * self.code_bits // 8

    def scale_bytes(self, shape: tuple[int, ...]) -> int:
        """Bytes of the scales as shipped."""
        return math.prod(self.scale_shape(shape)) * self.scale_bits // 8

    def streamed_scale_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """The scales as the kernel streams them: f32, one per group of inputs
        and per output column ([..., K/g, N]; int8: [..., 1, N])."""
        *lead, k, n = shape
        return (*lead, k // self.group(k), n)

    def shipped_bytes(self, shape: tuple[int, ...], itemsize: int) -> int:
        """Bytes of a weight of ``shape`` as a checkpoint ships it."""
        if self.plain:
            return math.prod(shape) * itemsize
        return self.code_bytes(shape) + self.scale_bytes(shape)

    def hbm_bytes(self, shape: tuple[int, ...], itemsize: int) -> int:
        """Bytes of a weight of ``shape`` in the kernel's HBM operands: codes
        plus f32 scales per group and column (``streamed_scale_shape``), or
        ``itemsize`` (the model dtype's) per element when plain. Widening the
        scales to f32 costs 0.25-1 bit per weight over ``shipped_bytes``; it
        keeps one decode path for every format's scales."""
        if self.plain:
            return math.prod(shape) * itemsize
        return self.code_bytes(shape) + math.prod(self.streamed_scale_shape(shape)) * 4

    def check(self, shape: tuple[int, ...], where: str) -> None:
        """A weight of ``shape`` can be held in this format, or a named error."""
        if self.plain:
            return
        if len(shape) < 2:
            raise IRError(f"format {self.name!r} quantizes matrices; this weight has shape "
                          f"{tuple(shape)}", path=where, hint="leave vectors plain")
        k = shape[-2]
        quantum = self.row_quantum(k)
        if k % quantum:
            raise IRError(f"format {self.name!r} needs the input dimension to be a multiple "
                          f"of {quantum} (whole {self.code_rows}-row code tiles and whole "
                          f"scale groups of {self.group(k)}); found {k}", path=where,
                          hint="choose another format for this weight kind, or plain")


FORMATS: dict[str, Format] = {f.name: f for f in (
    Format("plain", "", 0, WHOLE, 1, "", 0, "the model dtype, unquantized"),
    Format("int8", "int8", 8, WHOLE, 1, "bfloat16", 16,
           "int8 codes, one bf16 scale per output channel", "scaled"),
    *(Format(f"int4_g{g}", "int4", 4, g, 1, "bfloat16", 16,
             f"int4 codes, one bf16 scale per {g} inputs of each output", "fp8")
      for g in (32, 64, 128)),
    Format("fp8_b128", "float8_e4m3fn", 8, 128, 128, "float32", 32,
           "float8 e4m3fn codes, one f32 scale per 128 x 128 block (DeepSeek-V3)", "fp8"),
    Format("mxfp4", "float4_e2m1fn", 4, 32, 1, "e8m0", 8,
           "e2m1 codes, one E8M0 power-of-two scale per 32 inputs (OCP MX)", "fp8"),
    Format("nvfp4", "float4_e2m1fn", 4, 16, 1, "float8_e4m3fn", 8,
           "e2m1 codes, one e4m3 scale per 16 inputs and one f32 scale per tensor "
           "(NVIDIA NVFP4)", "fp8"),
)}
PLAIN = FORMATS["plain"]

# What a card's ``quantize`` table may name: every matrix of the model is one
# of these (``WEIGHT_KINDS`` in ir/weight_kinds.py says which).
KINDS = ("dense", "attention", "router", "experts", "embedding", "lm_head")
# Weight kinds whose kernel path reads them through a gather or a router
# comparison, where only plain storage is implemented.
PLAIN_ONLY = {"embedding": "the embedding is gathered by token id",
              "router": "routing compares raw scores, kept exact",
              "attention": "the MLA library reads its up-projections plain"}


def get(name: str, *, path: str = "format") -> Format:
    try:
        return FORMATS[name]
    except KeyError:
        raise IRError(f"unknown weight format {name!r}; known: {sorted(FORMATS)}",
                      path=path) from None


def check_table(table: dict[str, str] | None, *, path: str = "quantize") -> dict[str, str]:
    """A card's ``quantize`` table ({weight kind: format}), checked: every kind
    known, every format known, plain-only kinds plain."""
    out = {}
    for kind, name in (table or {}).items():
        where = f"{path}.{kind}" if path else kind
        if kind not in KINDS:
            raise IRError(f"unknown weight kind {kind!r}; known: {list(KINDS)}",
                          path=where)
        fmt = get(name, path=where)
        if kind in PLAIN_ONLY and not fmt.plain:
            raise IRError(f"{kind} weights can only be plain ({PLAIN_ONLY[kind]}); found "
                          f"{name!r}", path=where, hint=f"remove {kind!r}")
        out[kind] = name
    return out
