"""The records of a pre-quantized checkpoint's scheme: how one quantized
module's tensors are stored (``Layout``), which modules a layout applies to
(``Group``) and the whole checkpoint's (``Scheme``), and the helpers every
``quantization_config`` reader shares (models/shipped.py lists the readers)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from megakernel.errors import ConfigError, shown
from megakernel.models.quant_targets import Boundary, matches

FLOAT_SCALES = ("F32", "BF16", "F16")


@dataclass(frozen=True)
class Layout:
    """How the tensors of one quantized module ``X`` are stored: codes in
    ``X.{codes}`` (dtypes ``code_dtypes``, ``per`` codes per stored element
    along ``in``, each ``bits`` wide plus ``offset``), scales in ``X.{scales}``,
    the [out, in] shape in ``X.{shape}`` ("" none; required or not).
    ``{stem}`` in a name is the last part of the float tensor name it
    replaces, one of ``stems`` (``X.weight``: "weight"). ``blocks``: the codes'
    last two axes are [in / (per blocks), blocks], merged on read. ``ndim``:
    dimensions of the float tensor ([E, ...] for fused experts); ``in_out``:
    the float tensor is [..., in, out] rather than Hugging Face's [out, in].
    ``global_scale``: ``X.{global_scale}`` is the module's f32 scale over its
    block scales (nvfp4), the reciprocal of one (``global_divides``)."""

    method: str
    fmt: str
    codes: str
    code_dtypes: tuple[str, ...]
    scales: str
    scale_dtypes: tuple[str, ...]
    per: int = 1
    bits: int = 8
    offset: int = 0
    shape: str = ""
    shape_required: bool = False
    stems: tuple[str, ...] = ("weight",)
    blocks: int = 0
    ndim: int = 2
    in_out: bool = False
    global_scale: str = ""
    global_divides: bool = False

    def names(self, module: str, stem: str) -> tuple[str, str, str]:
        """The codes, scales and shape tensor names of ``module.stem``."""
        return tuple(f"{module}.{t.format(stem=stem)}" if t else ""
                     for t in (self.codes, self.scales, self.shape))

    def stored(self) -> str:
        """The codes' shape as stored, in words (for errors)."""
        lead = ["E"] * (self.ndim - 2)
        if self.blocks:
            return str([*lead, "out", f"in / {self.per * self.blocks}", self.blocks])
        return str([*lead, "out", f"in / {self.per}" if self.per > 1 else "in"])

    def unpack(self, raw: np.ndarray, width: int) -> np.ndarray:
        """Stored codes [..., out, ceil(width / per)] (``blocks``: [..., out,
        width / (per blocks), blocks]) -> one code per weight [..., out,
        width]: int8 values (int formats) or uint8 bit patterns."""
        if self.blocks:
            raw = raw.reshape(*raw.shape[:-2], -1)
        if self.per == 1:            # fp8: one e4m3 code per byte, as stored
            return raw
        word = raw.astype(np.int64) & ((1 << (raw.dtype.itemsize * 8)) - 1)
        mask = (1 << self.bits) - 1
        fields = [(word >> (self.bits * i)) & mask for i in range(self.per)]
        codes = np.stack(fields, axis=-1).reshape(*raw.shape[:-1], -1)[..., :width]
        return (codes - self.offset).astype(np.int8 if self.offset else np.uint8)


@dataclass(frozen=True)
class Group:
    layout: Layout
    targets: tuple[str, ...]


@dataclass(frozen=True)
class Scheme:
    """A checkpoint's quantized modules: ``groups`` (a layout and the targets it
    applies to), minus ``ignore``, among the matrices of weight ``kinds``.
    ``unread``: suffixes of tensors the checkpoint stores for what this loader
    keeps in the model dtype (activation and cache scales), not read."""

    method: str
    groups: tuple[Group, ...]
    ignore: tuple["str | Boundary", ...]
    kinds: frozenset[str]
    unread: tuple[str, ...] = ()

    def layout_of(self, module: str, kind: str | None) -> Layout | None:
        """The layout HF module ``module`` (a matrix of weight ``kind``) ships in,
        or None when it ships as a float weight."""
        if kind not in self.kinds or any(matches(t, module) for t in self.ignore):
            return None
        hits = {g.layout for g in self.groups if any(matches(t, module) for t in g.targets)}
        if len(hits) > 1:
            raise ConfigError(f"{module} matches config groups of formats "
                              f"{sorted(h.fmt for h in hits)}", path="quantization_config",
                              hint="make the groups' targets disjoint")
        return hits.pop() if hits else None

    def locate(self, name: str, kind: str | None) -> tuple[str, str, Layout] | None:
        """(module, stem, layout) of checkpoint tensor ``name`` (a matrix of
        weight ``kind``) when it ships quantized, else None."""
        module, _, stem = name.rpartition(".")
        layout = self.layout_of(module, kind) if module else None
        return None if layout is None or stem not in layout.stems else (module, stem, layout)



def check_keys(data: dict, known: set[str], where: str, problems: list[str]) -> None:
    for key in sorted(set(data) - known):
        if data[key] not in (None, {}, []):
            problems.append(f"{where}{key}: {shown(data[key])} (unknown key, not supported)")


def want(data: dict, key: str, allowed: tuple, where: str, problems: list[str],
          why: str = "") -> Any:
    value = data.get(key)
    if value not in allowed:
        problems.append(f"{where}{key}: found {shown(value)}, expected "
                        f"{' or '.join(shown(a) for a in allowed)}{why}")
    return value
