"""Declarations of the generated module, rendered from the plan and nothing else.

``scratch_lines`` renders every scratch buffer of ``plan.memory`` (in plan
order, by name); ``segment_tables`` the weight ring's tile tables (each tile's
bank from ``plan.memory.ring``); ``geometry_lines`` each op library's geometry
record, field by field; ``buffer_bundles`` each op library's buffers, as the
plan bound them to a node, as one record the node's calls pass as ``bufs``.
Every value written into the source goes through
``literal``, which accepts only checked Python values (bools, ints, finite
floats, None, strings rendered as quoted literals) and refuses anything else,
so nothing from a model file can reach the source as code. ``wrap_source``
keeps every line of the module within ``WIDTH`` characters.
"""

from __future__ import annotations

import ast
import dataclasses
import math

from megakernel import dtypes
from megakernel.compiler.buffers import Space
from megakernel.compiler.shard_formats import scale_name
from megakernel.errors import EmitError
from megakernel.registry import Registry

# The kernel's three groups of refs (runtime.bind), by the plan buffer's role.
GROUPS = {"operand": "inputs", "output": "outputs", "scratch": "scratch"}
SEMAPHORES = {"dma_semaphore": "pltpu.SemaphoreType.DMA",
              "semaphore": "pltpu.SemaphoreType.REGULAR"}
# Kernel library (``Op.LIBRARY``) -> the name the generated module imports it
# as (``from megakernel.backends.pallas_tpu.kernels import attention as attn_lib``),
# registered with the kind's emitter.
LIBRARIES: Registry = Registry("library import", "backends/pallas_tpu/codegen/kind_*.py",
                               per_op_kind=False, needed_by=lambda cls: cls.LIBRARY is not None,
                               need="it has a kernel library", key_of=lambda cls: cls.LIBRARY,
                               keyed_by="kernel library")


def literal(value) -> str:
    """Python source for a checked scalar value (or a tuple of them)."""
    if value is None or isinstance(value, bool):
        return repr(value)
    if isinstance(value, int):
        return repr(int(value))
    if isinstance(value, float):
        if not math.isfinite(value):
            raise EmitError(f"{value!r} is not a finite number; it cannot be emitted",
                            path="emit.literal")
        return repr(float(value))
    if isinstance(value, str):
        return repr(str(value))           # a quoted literal, never code
    if isinstance(value, tuple):
        inner = ", ".join(literal(v) for v in value)
        return f"({inner},)" if len(value) == 1 else f"({inner})"
    raise EmitError(f"a {type(value).__name__} value ({str(value)[:60]!r}) cannot be "
                    "emitted into the kernel source", path="emit.literal")


def ref(plan, name: str) -> str:
    """The kernel's expression of plan buffer ``name``: ``inputs.<ident>``,
    ``outputs.<ident>`` or ``scratch.<ident>`` (its group of refs)."""
    b = plan.memory.buffer(name)
    if b.role not in GROUPS:
        raise EmitError(f"plan buffer {name!r} ({b.role}) is not a ref of the kernel",
                        path=f"plan.memory.{name}")
    return f"{GROUPS[b.role]}.{b.ident}"


def tuple_of(items) -> str:
    """Python source of a tuple of expressions: ``(a, b)``, ``(a,)`` or ``()``."""
    items = list(items)
    return f"({items[0]},)" if len(items) == 1 else f"({', '.join(items)})"


# Lines of the generated module are at most this long (the wrapped ones split
# after a comma of their first bracket, as a person would).
WIDTH = 120
BRACKETS = {"(": ")", "[": "]", "{": "}"}


def _outside_strings(code: str):
    """(index, character) of ``code`` outside its string literals."""
    quote, i = None, 0
    while i < len(code):
        ch = code[i]
        if quote:
            if ch == "\\":
                i += 1
            elif ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
        else:
            yield i, ch
        i += 1


def _code_and_comment(line: str) -> tuple[str, str]:
    """(the code of ``line``, the text of its trailing ``#`` comment or "")."""
    at = next((i for i, ch in _outside_strings(line) if ch == "#"), None)
    return (line, "") if at is None else (line[:at].rstrip(), line[at + 1:].strip())


def _first_group(code: str):
    """(open, close) of the first bracket of ``code`` at depth 0, or None when
    it does not close on this line."""
    depth, start = 0, None
    for i, ch in _outside_strings(code):
        if ch in BRACKETS:
            if depth == 0 and start is None:
                start = i
            depth += 1
        elif ch in BRACKETS.values():
            depth -= 1
            if depth == 0 and start is not None:
                return start, i
    return None


def _items(body: str) -> list[str]:
    """``body`` split at its commas of depth 0 (each item stripped; a trailing
    comma leaves an empty last item)."""
    items, depth, last = [], 0, 0
    for i, ch in _outside_strings(body):
        if ch in BRACKETS:
            depth += 1
        elif ch in BRACKETS.values():
            depth -= 1
        elif ch == "," and depth == 0:
            items.append(body[last:i].strip())
            last = i + 1
    return items + [body[last:].strip()]


def _wrap_comment(indent: str, text: str, width: int) -> list[str]:
    lines, cur = [], f"{indent}#"
    for word in text.split():
        if len(cur) + 1 + len(word) > width and cur != f"{indent}#":
            lines.append(cur)
            cur = f"{indent}#"
        cur += " " + word
    return lines + [cur]


def _wrap_code(code: str, width: int) -> list[str]:
    group = _first_group(code)
    if len(code) <= width or group is None:
        return [code]
    start, end = group
    head, tail = code[:start + 1], code[end:]
    items = _items(code[start + 1:end])
    trailing = len(items) > 1 and items[-1] == ""
    items = items[:-1] if trailing else items
    pieces = [f"{item}," for item in items[:-1]] + [items[-1] + ("," if trailing else "") + tail]
    indent = " " * (len(code) - len(code.lstrip()))
    # after the bracket, as a person aligns a call's arguments; 4 past the
    # line's indent where that leaves too little room
    hanging = len(head) > width // 2 or len(head) + len(pieces[0]) > width
    out, cur = ([head], f"{indent}    ") if hanging else ([], head)
    prefix, fresh = (cur if hanging else " " * len(head)), True
    for piece in pieces:
        if fresh or len(cur) + 1 + len(piece) <= width:
            cur += ("" if fresh else " ") + piece
        else:
            out.append(cur)
            cur = prefix + piece
        fresh = False
    out.append(cur)
    if out == [code]:
        return out
    return [line for part in out for line in _wrap_code(part, width)]


def wrap(line: str, width: int = WIDTH) -> list[str]:
    """``line`` of source as lines of at most ``width`` characters where it can
    be: its trailing comment on a line of its own above it, a statement split
    after the commas of its first bracket (recursively)."""
    if len(line) <= width:
        return [line]
    indent = " " * (len(line) - len(line.lstrip()))
    code, note = _code_and_comment(line)
    above = _wrap_comment(indent, note, width) if note else []
    return above + (_wrap_code(code, width) if code.strip() else [])


def wrap_source(source: str, width: int = WIDTH) -> str:
    """Every code line of ``source`` longer than ``width`` wrapped (``wrap``);
    lines inside triple-quoted strings are left as they are. The module's
    syntax tree is checked unchanged."""
    out, in_string = [], False
    for line in source.split("\n"):
        if in_string or '"""' in line:
            out.append(line)
            in_string ^= line.count('"""') % 2 == 1
            continue
        out.extend(wrap(line, width))
    wrapped = "\n".join(out)
    if ast.dump(ast.parse(wrapped)) != ast.dump(ast.parse(source)):
        raise EmitError("wrapping the generated lines changed the module's code",
                        path="emit.wrap_source")
    return wrapped


def comment(text: str) -> str:
    """``text`` made safe for a one-line ``#`` comment (printable ASCII only)."""
    return "".join(ch if " " <= ch <= "~" else "?" for ch in str(text))[:200]


def dtype_expr(dtype: str) -> str:
    d = dtypes.of(dtype)
    if d.bits == 0:
        raise EmitError(f"{dtype!r} is not an array dtype", path="emit.dtype")
    return d.kernel


def scratch_shape(space: Space, shape: tuple[int, ...], dtype: str) -> str:
    """The pltpu spelling of one buffer."""
    if space == Space.SEMAPHORE:
        return f"{SEMAPHORES[dtype]}({literal(tuple(shape))})"
    kind = {Space.VMEM: "pltpu.VMEM", Space.SMEM: "pltpu.SMEM"}[space]
    return f"{kind}({literal(tuple(shape))}, {dtype_expr(dtype)})"


def allocation(space: Space, shape: tuple[int, ...], dtype: str):
    """The pltpu object of one buffer, for code that builds a kernel directly
    (the op tests): the same spelling ``scratch_shape`` writes."""
    import jax.numpy as jnp
    from jax.experimental.pallas import tpu as pltpu

    if space == Space.SEMAPHORE:
        kind = {"dma_semaphore": pltpu.SemaphoreType.DMA,
                "semaphore": pltpu.SemaphoreType.REGULAR}[dtype]
        return kind(tuple(shape))
    return {Space.VMEM: pltpu.VMEM, Space.SMEM: pltpu.SMEM}[space](tuple(shape), jnp.dtype(dtype))


def scratch_lines(plan) -> list[tuple[str, str, str]]:
    """(variable, pltpu shape expression, note) of every scratch buffer."""
    return [(b.ident, scratch_shape(b.space, b.shape, b.dtype),
             comment(b.note or b.kind.value)) for b in plan.memory.scratch()]


def library_alias(library: str) -> str:
    return LIBRARIES(library)


def geometry_name(g) -> str:
    return f"{g.library.upper()}_S{g.stack}_{g.node}"


def bundle_name(node: str) -> str:
    """The kernel's variable of the buffers bound to op ``node`` (an identifier)."""
    return f"{node}_bufs"


def buffer_bundles(plan) -> list[str]:
    """``<node>_bufs = <library>.Buffers(arg=buffer, ...)``: the buffers the plan
    bound to each op with a kernel library, once per node name (a node of
    every stack gets the same buffers)."""
    mem, lines, seen = plan.memory, [], {}
    for g in mem.geometries:
        bound = mem.bound(g.stack, g.node)
        name = bundle_name(g.node)
        if name in seen:
            if seen[name] != bound:
                raise EmitError(f"op {g.node!r} of stack {g.stack} is bound to other buffers "
                                "than the same node of an earlier stack",
                                path=f"layers[{g.stack}].{g.node}")
            continue
        seen[name] = bound
        args = ", ".join(f"{arg}={ref(plan, buf)}" for arg, buf in bound.items())
        lines.append(f"{name} = {library_alias(g.library)}.Buffers({args})")
    return lines


def geometry_lines(plan, max_seq_len: int) -> list[str]:
    """Each op library's geometry record, field by field (a field equal to the
    model's ``max_seq_len`` by the module's constant's name)."""
    out = []
    for g in plan.memory.geometries:
        record = g.geometry
        # Options at their default are left out: a plain model's source reads
        # as before the option existed.
        fields = ", ".join(f"{f.name}={_field(f.name, getattr(record, f.name), max_seq_len)}"
                           for f in dataclasses.fields(record)
                           if f.default is dataclasses.MISSING
                           or getattr(record, f.name) != f.default)
        out.append(f"{geometry_name(g)} = {library_alias(g.library)}."
                   f"{type(record).__name__}({fields})")
    return out


def _field(name: str, value, max_seq_len: int) -> str:
    if name == "max_seq_len" and value == max_seq_len:
        return "MAX_SEQ_LEN"
    return literal(value)


def _tile_entry(ring, ref: int, t, sref: int | None = None) -> dict:
    # A quantized tile names its format and where its scales come from
    # (operand ``sref``) and go (auxiliary ring ``sbank``); plain tiles read
    # as before quantized formats existed.
    extra = "" if t.format == "plain" else (
        f", fmt={literal(t.format)}, sref={sref}, sr0={t.scale_row0}, "
        f"srows={t.scale_view[0]}, sbank={ring.scale_bank(t)}")
    return {"args": f"{ref}, {t.row0}, {t.rows}, {t.col0}, {t.cols}, bank={ring.bank_of(t)}, "
                    f"dtype={literal(t.dtype)}{extra}",
            "note": comment(f"{t.param}[{t.row0}:{t.row0 + t.rows}, {t.col0}:{t.col0 + t.cols}]")}


def segment_tables(plan, ctxs) -> list[dict]:
    """One ``rt.Segment`` table per stack (tiles of one layer), then the head."""
    stream, ring = plan.memory.stream, plan.memory.ring
    # A body with runs of equal layers: (first tile, tiles, layers) of each
    # run (rendered only then, so other kernels read as before).
    out = [{"name": f"S{c.s}_TILES", "offset": c.stream.offset, "count": c.stream.count,
            "layered": True, "runs": (f", runs={literal(c.stream.runs)}" if c.stream.run_tiles
                                      else ""),
            "tiles": [_tile_entry(ring, c.ring.index(t.param), t,
                                  c.ring.index(scale_name(t.param)) if t.scale_view else None)
                      for t in c.stream.tiles]}
           for c in ctxs]
    out.append({"name": "HEAD_TILES", "offset": stream.head_offset, "count": 1,
                "layered": False, "runs": "", "tiles": [_tile_entry(ring, 0, t, 1 if t.scale_view else None)
                          for t in stream.head]})     # a quantized head's scales: ref 1
    return out
