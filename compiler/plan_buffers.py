"""The per-layer buffers of the memory plan: op libraries' buffers and vectors.

After ``layer_buffers``: every op of every stack's layer has, through its
``BUFFERS`` rule, the geometry its kernel library runs with and one plan
buffer for each buffer that library asks for (``Binding``: the library's
argument name -> the plan buffer; an op's own buffers are shared by every
body position and stack that runs the same op at the same shape); every
per-layer vector weight has a
[2, 1, n] buffer indexed by layer parity; the loop-carried residual stream is
one [rows, hidden] f32 buffer. Ops computed on values only (norms, rope,
projections through the ring, adds) ask for nothing: Mosaic keeps their
values, and the plan accounts for that separately (``plan_memory.values``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from megakernel.compiler.buffers import Binding, Buffer, Kind, Need, OpGeometry, Space
from megakernel.compiler.layout import padded_bytes, scratch_bytes, smem_bytes
from megakernel.registry import Registry


class BufferTable:
    """Buffers by name; adding a name again widens its lifetime to the union,
    or, when the shape differs, files it under a stack-qualified name."""

    def __init__(self, by_name: dict[str, Buffer] | None = None):
        self._by_name: dict[str, Buffer] = dict(by_name or {})
        # Every name an add looked up: a table filled on its own is merged
        # into another (``merge``) only where none of them is taken there.
        self.tried: set[str] = set()

    def add(self, b: Buffer, stack: int | None = None, *, shared: str | None = None) -> str:
        """File ``b`` under its name (see the class), or first under ``shared``
        when that name is free or holds a buffer of the same shape."""
        if shared is not None:
            self.tried.add(shared)
            old = self._by_name.get(shared)
            if old is None or _same_layout(old, b):
                return self.add(dataclasses.replace(b, name=shared))
        self.tried.add(b.name)
        old = self._by_name.get(b.name)
        if old is None:
            self._by_name[b.name] = b
            return b.name
        if _same_layout(old, b):
            self._by_name[b.name] = Buffer(old.name, old.space, old.kind, old.shape, old.dtype,
                                           old.nbytes, min(old.first, b.first),
                                           max(old.last, b.last), old.note, old.role)
            return b.name
        if stack is None:
            raise ValueError(f"buffer {b.name} declared twice with different shapes")
        renamed = Buffer(f"s{stack}.{b.name}", b.space, b.kind, b.shape, b.dtype, b.nbytes,
                         b.first, b.last, b.note, b.role)
        return self.add(renamed)

    def buffers(self) -> tuple[Buffer, ...]:
        return tuple(self._by_name.values())

    def merge(self, part: "BufferTable") -> bool:
        """Add ``part``'s buffers (a table filled from empty) as if its adds
        were made here, in order: exactly so when no name they looked up is
        taken here, and then True; else False, and nothing is added."""
        if not part.tried.isdisjoint(self._by_name):
            return False
        self._by_name.update(part._by_name)
        return True


def _same_layout(a: Buffer, b: Buffer) -> bool:
    return (a.shape, a.dtype, a.space, a.role) == (b.shape, b.dtype, b.space, b.role)


def sized(name: str, space: Space, kind: Kind, shape, dtype: str, first: int, last: int,
          note: str = "", role: str = "scratch") -> Buffer:
    """A buffer with its tile-padded size (SMEM: 32-bit words; semaphores: 0)."""
    shape = tuple(shape)
    # (if/else, not a dict of lambdas: the geometry search calls this ~10^4 times)
    if space is Space.SMEM:
        nbytes = smem_bytes(shape, dtype)
    elif space is Space.SEMAPHORE:
        nbytes = 0
    elif space is Space.VMEM and role == "scratch":   # tiled as Mosaic tiles scratch
        nbytes = scratch_bytes(shape, dtype)
    else:                                   # operands (laid out by XLA) and HBM: tile-padded
        nbytes = padded_bytes(shape, dtype)
    return Buffer(name, space, kind, shape, dtype, nbytes, first, last, note, role)


@dataclass(frozen=True)
class OpLayout:
    """What one op's kernel library needs on one core: its geometry (None for
    ops computed on values) and the buffers it asks for."""

    library: str | None = None
    geometry: object = None
    needs: tuple[Need, ...] = ()
    kind: Kind = Kind.SCRATCH
    values: int = 0          # bytes of temporaries its code holds beyond its inputs and output
    # The buffers hold data across the whole stack (e.g. state fetched by the
    # previous repetition), not only during the op's own program point.
    stack_lifetime: bool = False


@dataclass(frozen=True)
class OpCtx:
    """What a buffer rule sees: the plan around one node of one stack."""

    model: object
    ss: object           # StackShard
    request: object
    rows: int
    rows_padded: int
    kv: tuple
    experts: tuple
    target: object = None    # the Target (cost constants, for rules that choose by cost)


VECTORS = "<vectors>"      # Binding.node of a stack's per-layer vector buffers

# One rule per op kind: (ctx, node) -> OpLayout.
BUFFERS: Registry = Registry("buffer", "compiler/kind_*.py (linear, add: compiler/plan_buffers.py)")
BUFFERS.register("linear", "add")(lambda cx, node: OpLayout())


def layer_buffers(table: BufferTable, model, shard, request, points, kv, experts,
                  rows_p, target=None) -> tuple[tuple[Binding, ...], tuple[OpGeometry, ...], int]:
    """Add every stack's buffers to ``table``; returns (bindings, geometries,
    the most bytes of values one op of a layer holds with the tensors live
    around it)."""
    index = {p.label: p.index for p in points}
    last = len(points) - 1
    table.add(sized("residual", Space.VMEM, Kind.ACTIVATION, (rows_p, model.hidden_size),
                    "float32", 0, last, "loop-carried residual stream"))
    bindings, geometries, most_vectors, peak = [], [], 0, 0
    spans: dict[int, list[int]] = {}             # stack -> its first and last program point
    for p in points:
        if p.stack is not None:
            spans.setdefault(p.stack, [p.index, p.index])[1] = p.index
    for st, ss in zip(model.stacks, shard.stacks):
        s = ss.stack
        cx = OpCtx(model, ss, request, request.rows, rows_p, kv, experts, target)
        mine = spans[s]
        live = _live_tensors(st.layer)
        widths = dict(ss.widths)
        for node in st.layer.nodes:
            at = index[f"s{s}.{node.name}"]
            layout = BUFFERS(node.op.kind, f"layers[{s}].{node.name}")(cx, node)
            first, last_use = (mine[0], mine[-1]) if layout.stack_lifetime else (at, at)
            tensors = sum(rows_p * widths[t] * 4 for t in live[node.name])
            # An op's own buffers (live at its program point only) are one
            # allocation for every body position of the op (l0_moe, l1_moe: the
            # layer-local name), as they are for the layers of a run and for
            # stacks: the ops run one after another.
            shared = (None if layout.stack_lifetime or st.period == 1
                      else node.name.partition("_")[2])
            peak = max(peak, tensors + layout.values)
            if layout.geometry is not None:
                geometries.append(OpGeometry(s, node.name, layout.library, layout.geometry))
            for need in layout.needs:
                kind = Kind.SEMAPHORES if need.space == Space.SEMAPHORE else (
                    Kind.SCALARS if need.space == Space.SMEM else layout.kind)
                name = table.add(sized(f"{node.name}.{need.name}", need.space, kind,
                                       need.shape, need.dtype, first, last_use, need.note),
                                 stack=s, shared=shared and f"{shared}.{need.name}")
                bindings.append(Binding(s, node.name, need.name, name))
        vectors = [p for p in ss.params if p.channel == "vector"]
        for p in vectors:
            name = table.add(sized(f"vec.{p.name}", Space.VMEM, Kind.LAYER_VECTORS,
                                   (2, 1, *p.shape), p.dtype, 0, last,
                                   "[layer parity]; next layer's copy in flight"), stack=s)
            bindings.append(Binding(s, VECTORS, p.name, name))
        most_vectors = max(most_vectors, len(vectors))
    table.add(sized("vec.sems", Space.SEMAPHORE, Kind.SEMAPHORES, (2, max(most_vectors, 1)),
                    "dma_semaphore", 0, last, "[parity, vector of the running stack]"))
    return tuple(bindings), tuple(geometries), peak


def layer_table(model, shard, request, points, kv, experts, rows_p, target):
    """(a table of the layers' buffers alone, bindings, geometries, peak)."""
    table = BufferTable()
    return (table, *layer_buffers(table, model, shard, request, points, kv, experts, rows_p,
                                  target))


def _live_tensors(layer) -> dict[str, set[str]]:
    """Per node, the layer tensors held as values while it runs: those made
    before it (or the layer input) and read by it or after it, and its outputs."""
    last = {}
    for i, n in enumerate(layer.nodes):
        for t in n.inputs:
            last[t] = i
    made = {layer.input: -1} | {t: i for i, n in enumerate(layer.nodes) for t in n.outputs}
    return {n.name: {t for t, m in made.items() if m <= i and (last.get(t, m) >= i or m == i)}
            for i, n in enumerate(layer.nodes)}
