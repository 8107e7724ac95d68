"""Read a compiled TPU program's HLO text: its computations, instructions and arrays.

After ``parse(text)``: a ``Module`` with every computation's instructions in
order (the entry's order is the schedule XLA runs), each with its result type
(an ``Array`` or a tuple of them, with dims, minor-to-major layout and memory
space: 0 HBM, 1 VMEM, 6 SMEM on TPU), its operand names and its attribute text.
Only what ``bench/xla_cost.py`` reads is parsed.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from megakernel import dtypes

HBM, VMEM, SMEM = 0, 1, 6


@dataclass(frozen=True)
class Array:
    dtype: str                     # HLO spelling: bf16, f32, s32, pred, ...
    dims: tuple[int, ...]
    minor_to_major: tuple[int, ...]
    space: int = HBM

    @property
    def elems(self) -> int:
        return math.prod(self.dims)

    @property
    def nbytes(self) -> int:
        d = dtypes.HLO.get(self.dtype)
        bits = d.bits if d is not None else (1 if self.dtype == "pred" else 32)
        return max(bits, 8) * self.elems // 8


@dataclass(frozen=True)
class Instr:
    name: str
    opcode: str
    type: object                   # Array, or a tuple of types
    operands: tuple[str, ...]
    attrs: str
    args: str = ""                 # the text between the opcode's parentheses

    def arrays(self) -> list[Array]:
        return flat(self.type)

    def attr(self, key: str) -> str | None:
        m = re.search(rf"\b{key}=([^,\s]+)", self.attrs)
        return m.group(1) if m else None


@dataclass(frozen=True)
class Module:
    computations: dict             # name -> tuple[Instr, ...]
    entry: str

    def instrs(self, comp: str | None = None) -> tuple[Instr, ...]:
        return self.computations[comp or self.entry]

    def defs(self, comp: str | None = None) -> dict:
        return {i.name: i for i in self.instrs(comp)}


def flat(t) -> list[Array]:
    return [t] if isinstance(t, Array) else [a for e in t for a in flat(e)]


_ARRAY = re.compile(r"([a-z][a-z0-9]*)\[([\d,]*)\](\{[^}]*\})?")


def _array(m) -> Array:
    dims = tuple(int(d) for d in m.group(2).split(",") if d)
    layout = m.group(3) or ""
    order = re.match(r"\{([\d,]*)", layout)
    mtm = tuple(int(d) for d in order.group(1).split(",") if d) if order else ()
    space = re.search(r"S\((\d+)\)", layout)
    return Array(m.group(1), dims, mtm or tuple(reversed(range(len(dims)))),
                 int(space.group(1)) if space else HBM)


def _closing(text: str, start: int) -> int:
    """Index of the parenthesis closing the one at ``start``."""
    depth = 0
    for i in range(start, len(text)):
        depth += {"(": 1, ")": -1}.get(text[i], 0)
        if depth == 0:
            return i
    raise ValueError(f"unbalanced parentheses in {text[:120]!r}")


def _type(text: str):
    """(type, length) of the type that starts ``text``."""
    if text.startswith("("):
        end, parts, i = _closing(text, 0), [], 1
        while i < end:
            if text[i] in ", ":
                i += 1
                continue
            t, n = _type(text[i:end])
            parts.append(t)
            i += n
        return tuple(parts), end + 1
    m = _ARRAY.match(text)
    if not m:
        raise ValueError(f"not an HLO type: {text[:80]!r}")
    return _array(m), m.end()


_INSTR = re.compile(r"\s*(?:ROOT\s+)?%([\w.\-]+)\s*=\s*")


def _instr(line: str) -> Instr | None:
    m = _INSTR.match(line)
    if not m:
        return None
    rest = re.sub(r"/\*[^*]*\*/", "", line[m.end():])
    typ, n = _type(rest)
    op = re.match(r"\s*([\w\-]+)\(", rest[n:])
    if not op:
        return None
    open_at = n + op.end() - 1
    close = _closing(rest, open_at)
    operands = tuple(re.findall(r"%([\w.\-]+)", rest[open_at:close]))
    return Instr(m.group(1), op.group(1), typ, operands, rest[close + 1:],
                 rest[open_at + 1:close])


def parse(text: str) -> Module:
    comps, entry, name, body = {}, None, None, []
    for line in text.splitlines():
        head = re.match(r"(ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$", line)
        if name is None and head and not line.startswith(" "):
            name, body = head.group(2), []
            entry = name if head.group(1) else entry
        elif name is not None and line.startswith("}"):
            comps[name], name = tuple(body), None
        elif name is not None:
            ins = _instr(line)
            if ins is not None:
                body.append(ins)
    if entry is None:
        raise ValueError("no ENTRY computation in the HLO text")
    return Module(comps, entry)
