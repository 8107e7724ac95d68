"""The tensors of a safetensors checkpoint folder, read as untrusted data.

Before a byte of tensor data is read, every file's header is checked here
rather than by the safetensors library (whose errors name no tensor): the
8-byte header length within the file and ``limits.MAX_SAFETENSORS_HEADER``; the
header as bounded JSON (``ir/jsonfile.py``) of known keys; per tensor a known
dtype, a shape of at most ``MAX_TENSOR_RANK`` non-negative integers, and
``data_offsets`` inside the file's data whose length is exactly dtype size x
shape; in offset order the tensors tile the data, with no overlap, gap or
trailing bytes. An index (``model.safetensors.index.json``) must hold a
``weight_map``; it and the files it names resolve, through symlinks too, inside
the checkpoint folder or, for a Hugging Face hub cache snapshot, that
repository's ``blobs`` (``_roots``).
``get`` (a weight) refuses integer, bool and 8-bit float data (a weight of the
IR is a float; quantized tensors need scales) and values that are NaN or
infinite; float16, bfloat16, float32 and float64 tensors are returned as
stored and ``load_checkpoint`` converts them to the model's dtype.
``get_coded`` reads the tensors a pre-quantized format names (codes, scales,
shapes: models/shipped.py) in exactly the dtypes that format allows, so an
integer tensor is only ever read where a format expects one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, TypedDict

import ml_dtypes
import numpy as np
from pydantic import ConfigDict, Field, ValidationError

from megakernel.errors import ConfigError, shown
from megakernel.ir import limits
from megakernel.ir.jsonfile import parse_json, read_json
from megakernel.ir.schema import Int, adapter, check

# dtype -> (bytes per element, numpy type or None when nothing here reads it).
DTYPES: dict[str, tuple[int, Any]] = {
    "F64": (8, np.dtype("<f8")), "F32": (4, np.dtype("<f4")), "F16": (2, np.dtype("<f2")),
    "BF16": (2, np.dtype(ml_dtypes.bfloat16)),
    "F8_E4M3": (1, np.dtype(ml_dtypes.float8_e4m3fn)), "F8_E5M2": (1, None), "BOOL": (1, None),
    "I8": (1, np.dtype("i1")), "U8": (1, np.dtype("u1")), "I16": (2, None), "U16": (2, None),
    "I32": (4, np.dtype("<i4")), "U32": (4, None), "I64": (8, np.dtype("<i8")), "U64": (8, None),
}
# What a weight of the IR may be stored as (``get``); the rest only through ``get_coded``.
FLOATS = ("F64", "F32", "F16", "BF16")
INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"


class _Entry(TypedDict):
    __pydantic_config__ = ConfigDict(extra="forbid")
    dtype: Annotated[str, Field(max_length=16)]
    shape: Annotated[list[Int(0, 2**62)], Field(max_length=limits.MAX_TENSOR_RANK)]
    data_offsets: Annotated[list[Int(0, 2**63)], Field(min_length=2, max_length=2)]


class _Index(TypedDict, total=False):
    __pydantic_config__ = ConfigDict(extra="forbid")
    metadata: dict[str, Any]
    weight_map: Annotated[dict[str, Annotated[str, Field(min_length=1, max_length=1024)]],
                          Field(min_length=1)]


@dataclass(frozen=True)
class Tensor:
    """Where one tensor's bytes lie: ``file``, from byte ``start``, ``nbytes`` long."""

    name: str
    file: Path
    dtype: str
    shape: tuple[int, ...]
    start: int
    nbytes: int


def read_header(path: Path, label: str) -> dict[str, Tensor]:
    """The checked header of safetensors file ``path`` (``label`` names it)."""
    size = path.stat().st_size
    with path.open("rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise ConfigError(f"{size} bytes: too short for a safetensors file", path=label)
        n = int.from_bytes(head, "little")
        # Checked before the header is read: a hostile length costs nothing.
        if n > min(limits.MAX_SAFETENSORS_HEADER, size - 8):
            raise ConfigError(f"header length {n:,} bytes exceeds the file ({size:,} bytes) "
                              f"or the limit ({limits.MAX_SAFETENSORS_HEADER:,})", path=label,
                              hint="the file is truncated or not a safetensors file")
        raw = f.read(n)
    data = parse_json(raw, source=label, error=ConfigError,
                      max_bytes=limits.MAX_SAFETENSORS_HEADER)
    if not isinstance(data, dict):
        raise ConfigError(f"header is {shown(data)}, expected an object", path=label)
    data.pop("__metadata__", None)
    _check_entries(data, label)
    room = size - 8 - n
    tensors = {name: _tensor(path, label, name, entry, 8 + n, room)
               for name, entry in data.items()}
    _check_packed(tensors, label, 8 + n, room)
    return tensors


def _check_entries(data: dict, label: str) -> None:
    """Every entry's keys and types, in one pass of the schema (a header may
    list ~100k tensors); a failure is reported for its tensor by name."""
    try:
        adapter(dict[str, _Entry]).validate_python(data)
    except ValidationError as err:
        name = err.errors(include_url=False)[0]["loc"][0]
        check(_Entry, data.get(name), path=f"{label}: {shown(name)}", error=ConfigError)
        check(dict[str, _Entry], data, path=label, error=ConfigError)   # not reached


def _tensor(path: Path, label: str, name: str, entry: dict, base: int, room: int) -> Tensor:
    if entry["dtype"] not in DTYPES:
        raise ConfigError(f"dtype {shown(entry['dtype'])} is not a safetensors dtype; "
                          f"known: {sorted(DTYPES)}", path=f"{label}: {shown(name)}")
    begin, end = entry["data_offsets"]
    want = math.prod(entry["shape"]) * DTYPES[entry["dtype"]][0]
    if not begin <= end <= room or end - begin != want:
        raise ConfigError(f"data_offsets [{begin}, {end}] must lie in the file's {room:,} data "
                          f"bytes and span {want:,} bytes ({entry['dtype']} x "
                          f"{entry['shape']})", path=f"{label}: {shown(name)}",
                          hint="the file is truncated or its header is corrupt")
    return Tensor(name, path, entry["dtype"], tuple(entry["shape"]), base + begin, want)


def _check_packed(tensors: dict[str, Tensor], label: str, base: int, room: int) -> None:
    """The tensors' bytes, in offset order, tile the data exactly (as the
    safetensors format requires): no overlap, no gap, nothing after the last."""
    at, last = 0, None
    for t in sorted(tensors.values(), key=lambda t: (t.start, t.nbytes)):
        begin = t.start - base
        if begin != at:
            span = f"data_offsets [{begin:,}, {begin + t.nbytes:,}]"
            before = (f"{shown(last.name)} [{last.start - base:,}, {at:,}]" if last
                      else "the start of the data")
            raise ConfigError(f"{span} overlap {before}" if begin < at else
                              f"{span} leave bytes [{at:,}, {begin:,}) after {before} "
                              "that no tensor names", path=f"{label}: {shown(t.name)}",
                              hint="each tensor's bytes must start where the previous "
                              "one's end: the header is corrupt or was edited")
        at, last = at + t.nbytes, t
    if at != room:
        raise ConfigError(f"the tensors' data ends at byte {at:,} of the file's {room:,} data "
                          "bytes", path=label, hint="the file has trailing bytes no tensor "
                          "names: it is corrupt or not a safetensors file")


def _roots(folder: Path) -> tuple[Path, ...]:
    """Where a checkpoint's files may resolve: the folder itself and, for a
    Hugging Face hub cache snapshot (``models--ORG--NAME/snapshots/REV``, whose
    files are symlinks to ``../../blobs/HASH``), that repository's ``blobs``."""
    root = folder.resolve()
    repo = root.parent.parent
    if root.parent.name == "snapshots" and repo.name.startswith("models--"):
        # Not resolved: a ``blobs`` that is itself a symlink leads elsewhere.
        return root, repo / "blobs"
    return (root,)


def _inside(folder: Path, name: Any, named_by: str) -> Path:
    """``folder / name``, refused unless it resolves (symlinks followed) inside
    ``folder`` or its hub cache's blobs (``_roots``); ``named_by`` is the file
    that gave the name (the index, or the single file itself)."""
    if not isinstance(name, str) or Path(name).is_absolute():
        raise ConfigError(f"shard path {shown(name)} must be relative to the checkpoint folder",
                          path=named_by)
    target = (folder / name).resolve()
    roots = _roots(folder)
    if not any(target.is_relative_to(r) for r in roots):
        raise ConfigError(f"{shown(name)} resolves to {shown(str(target))}, outside the "
                          "checkpoint folder" + (" and its hub cache's blobs folder"
                                                 if len(roots) > 1 else ""),
                          path=named_by, hint="checkpoint files must be files inside the "
                          "folder (or, in a Hugging Face hub cache, symlinks into its blobs)")
    if not target.is_file():
        what = f"shard {shown(name)} listed in the index" if named_by.endswith(INDEX) else name
        broken = (folder / name).is_symlink()
        raise ConfigError(f"{what} is missing" + (f" (a symlink to {shown(str(target))}, "
                                                  "which does not exist)" if broken else ""),
                          path=str(folder), hint="download the checkpoint's files again"
                          if broken else "")
    return target


class TensorFiles:
    """Every tensor of a checkpoint folder by name, headers checked up front."""

    def __init__(self, folder: Path):
        if (folder / INDEX).exists():
            index_file = _inside(folder, INDEX, str(folder))
            index = check(_Index, read_json(index_file, error=ConfigError),
                          path=str(folder / INDEX), error=ConfigError)
            if "weight_map" not in index:
                raise ConfigError("has no weight_map", path=str(folder / INDEX),
                                  hint="an index maps each tensor name to its shard file")
            where = index["weight_map"]
        elif (folder / SINGLE).exists() or (folder / SINGLE).is_symlink():
            where = None
        else:
            raise ConfigError(f"no {SINGLE} or {INDEX}", path=str(folder))
        shards = sorted(set(where.values())) if where else [SINGLE]
        if len(shards) > limits.MAX_SHARDS:
            raise ConfigError(f"{len(shards)} shards; at most {limits.MAX_SHARDS}",
                              path=str(folder / INDEX))
        # The file that names each shard: the index, or the single file itself.
        named_by = str(folder / (INDEX if where else SINGLE))
        headers = {s: read_header(_inside(folder, s, named_by), s) for s in shards}
        self.tensors: dict[str, Tensor] = {}
        for name, shard in (where or {n: SINGLE for n in headers[SINGLE]}).items():
            if name not in headers[shard]:
                raise ConfigError(f"the index puts {shown(name)} in {shard}, whose header "
                                  "has no such tensor", path=str(folder / INDEX))
            self.tensors[name] = headers[shard][name]
        self.used: set[str] = set()

    def has(self, name: str) -> bool:
        return name in self.tensors

    def shape(self, name: str) -> tuple[int, ...]:
        return self.tensors[name].shape

    def get(self, name: str) -> np.ndarray:
        """The tensor's values as stored (a float type), checked finite."""
        t = self.tensors[name]
        if t.dtype not in FLOATS:
            self.used.add(name)
            raise ConfigError(f"{name} is stored as {t.dtype}; the model expects a float "
                              "weight (float16, bfloat16, float32 or float64)", path=name,
                              hint="dequantize the checkpoint, or give the float one")
        array = self._read(name)
        bad = ~np.isfinite(array)
        if bad.any():
            first = tuple(int(i) for i in np.argwhere(bad)[0])
            raise ConfigError(f"{name} holds {int(bad.sum()):,} NaN or infinite values "
                              f"(first at index {list(first)})", path=name,
                              hint="the checkpoint is corrupt or was saved after a diverged step")
        return array

    def get_coded(self, name: str, dtypes: tuple[str, ...], role: str) -> np.ndarray:
        """A tensor a quantized format names (``role``: "codes", "scales", ...),
        as stored, refused by name unless its dtype is one of ``dtypes``. Values
        are not checked here: the format's reader does (shipped_scales.from_shipped)."""
        t = self.tensors[name]
        if t.dtype not in dtypes:
            self.used.add(name)
            raise ConfigError(f"{name} ({role}) is stored as {t.dtype}; the checkpoint's "
                              f"quantization_config makes it {' or '.join(dtypes)}", path=name,
                              hint="the tensor does not belong to the format the config "
                              "names: re-export the checkpoint or fix its quantization_config")
        return self._read(name)

    def _read(self, name: str) -> np.ndarray:
        self.used.add(name)
        t = self.tensors[name]
        with t.file.open("rb") as f:
            f.seek(t.start)
            return np.frombuffer(bytearray(f.read(t.nbytes)),
                                 dtype=DTYPES[t.dtype][1]).reshape(t.shape)
