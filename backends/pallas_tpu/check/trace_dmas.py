"""Trace mode: every DMA one decode step really executed, from the TPU interpreter.

The interpreter runs ``DMA.execute_read`` exactly once per executed DMA with
its payload, memory spaces and devices (found by a one-off interpreter prototype);
wrapping it records (bytes, src/dst space, order, devices, kind). The kind
comes from the code that started the DMA (its source location): the weight
ring, per-layer vectors, the embedding gather, KV cache traffic, expert
slices, a remote (collective) copy, or a local (on-core, not HBM) copy.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

from megakernel import dtypes


@dataclass(frozen=True)
class DmaEvent:
    order: int
    nbytes: int
    src: str
    dst: str
    src_dev: int
    dst_dev: int
    kind: str


@dataclass(frozen=True)
class TraceResult:
    events: tuple[DmaEvent, ...]
    # Program order: (op, event order, core) with op "start" (the kernel issued
    # the DMA) or "done" (a wait consumed it; DMAs run on wait in the interpreter).
    order: tuple[tuple[str, int, int], ...] = ()
    # DMAs started and never waited: each leaves a count on its semaphore that
    # a later wait would take for its own DMA's (0 in a correct kernel).
    unwaited: int = 0

    def program(self, device: int = 0) -> list[tuple[str, int, int, str]]:
        """(op, DMA, bytes, kind) in the order core ``device`` issued and waited
        for its DMAs: the input of ``bench.replay``."""
        ev = {e.order: e for e in self.events}
        return [(op, i, ev[i].nbytes, ev[i].kind) for op, i, core in self.order
                if core == device and i in ev]

    def bytes_by_kind(self, device: int = 0) -> dict[str, int]:
        out: Counter = Counter()
        for e in self.events:
            if e.src_dev == device:
                out[e.kind] += e.nbytes
        return dict(out)

    def hbm_weight_bytes(self, device: int = 0) -> int:
        """HBM -> VMEM weight bytes of one step on ``device`` (ring, vectors,
        embedding rows and expert slices)."""
        k = self.bytes_by_kind(device)
        return sum(k.get(x, 0) for x in ("ring", "vector", "embed", "experts"))


_KINDS = (("Stream.", "ring"), ("ring_runs.py", "ring"), ("Vectors.", "vector"),
          ("gather_embedding", "embed"),
          ("attention.py", "kv"), ("new_rows.py", "kv"), ("mla_cache.py", "kv"),
          ("moe.py", "experts"), ("gdn.py", "state"))


def _kind(dma, ipc) -> str:
    if dma.src_device_id != dma.dst_device_id:
        return "collective"
    names = ipc.TPU_MEMORY_SPACE_NAMES
    if not {names[dma.src_memory_space], names[dma.dst_memory_space]} & {"any", "hbm"}:
        return "local"      # on-core copies, e.g. the routed expert ids VMEM -> SMEM
    where = _where(dma.source_info)
    for needle, kind in _KINDS:
        if needle in where:
            return kind
    return "other"


def _where(info) -> str:
    if info is None:
        return ""
    try:
        frames = info.traceback.frames if info.traceback is not None else []
        return " ".join(f"{f.file_name}:{f.function_name}" for f in frames)
    except Exception:  # noqa: BLE001 - best effort labelling
        return str(info)


class DmaLog:
    """Context manager: records every executed DMA (interpret mode only)."""

    def __init__(self):
        self.events: list[DmaEvent] = []
        self.unwaited = 0

    def __enter__(self):
        from jax._src.pallas.mosaic.interpret import interpret_pallas_call as ipc

        from jax._src.pallas.mosaic.interpret import shared_memory as shm

        self._ipc, self._shm = ipc, shm
        orig, orig_task = ipc.DMA.execute_read, shm.SharedMemory.append_semaphore_task
        self._orig, self._orig_task = orig, orig_task
        raw = self._raw = []
        order = self._order = []     # (op, dma id, issuing device)

        def execute_read(dma):
            fresh = dma.state == ipc.DmaState.STARTED
            orig(dma)
            if fresh:
                raw.append((dma.id, int(dma.data.nbytes),
                            ipc.TPU_MEMORY_SPACE_NAMES[dma.src_memory_space],
                            ipc.TPU_MEMORY_SPACE_NAMES[dma.dst_memory_space],
                            dma.src_device_id, dma.dst_device_id, _kind(dma, ipc)))
                order.append(("done", dma.id, dma.src_device_id))

        def append_semaphore_task(memory, sem_id, core_id, task):
            dma = getattr(task, "__self__", None)
            if isinstance(dma, ipc.DMA) and dma.state == ipc.DmaState.STARTED and (
                    not order or order[-1] != ("start", dma.id, dma.src_device_id)):
                order.append(("start", dma.id, dma.src_device_id))   # dma_start queues it
            return orig_task(memory, sem_id, core_id, task)

        ipc.DMA.execute_read = execute_read
        shm.SharedMemory.append_semaphore_task = append_semaphore_task
        return self

    def __exit__(self, *exc):
        self._ipc.DMA.execute_read = self._orig
        self._shm.SharedMemory.append_semaphore_task = self._orig_task
        index = {r[0]: i for i, r in enumerate(sorted(self._raw))}
        self.events = [DmaEvent(i, *r[1:]) for i, r in enumerate(sorted(self._raw))]
        self.order = tuple((op, index[d], dev) for op, d, dev in self._order if d in index)
        self.unwaited = sum(1 for op, d, _ in self._order if op == "start" and d not in index)


def trace_step(model, plan, weights, *, module=None, out_dir=None, seed: int = 0,
               interpret=None, positions=None) -> TraceResult:
    """Run one decode step (fresh caches) and return its executed DMAs; the
    step starts at ``positions`` ([batch], default: ``tokens``, after a step
    at 0 that is not logged)."""
    from megakernel.backends.pallas_tpu.codegen.load import compile_model
    from megakernel.backends.pallas_tpu.codegen import load
    from megakernel.backends.pallas_tpu.check import against_reference as run
    from megakernel.models import reference

    if module is None:
        import tempfile

        module = load.import_module(compile_model(model, plan, out_dir or tempfile.mkdtemp()))
    runner = run.KernelRunner(module, model, plan, weights, run.make_mesh(plan.shard.cores),
                              interpret or run.interpret_params(), with_logits=False)
    b, t = plan.request.batch, plan.request.tokens
    runner.set_caches({k: np.asarray(v) for k, v in
                       reference.init_caches(model, b).items()})
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, model.vocab_size, (b, t)).astype(np.int32)
    runner.step(tokens, np.zeros((b,), np.int32))          # compile outside the log
    start = np.full((b,), t, np.int32) if positions is None else np.asarray(positions, np.int32)
    with DmaLog() as log:
        runner.step(tokens, start)
    return TraceResult(tuple(log.events), log.order, log.unwaited)


def plan_weight_bytes(plan) -> dict[str, int]:
    """The plan's per-core HBM weight bytes of one step, by channel."""
    stream = plan.memory.stream
    ring = sum(st.count * st.bytes_per_layer for st in stream.stacks) + stream.head_bytes
    vector = sum(ss.reps(p.name) * int(np.prod(p.shape)) * dtypes.of(p.dtype).bits // 8
                 for ss in plan.shard.stacks for p in ss.params if p.channel == "vector")
    return {"ring": ring, "vector": vector}
