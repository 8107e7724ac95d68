"""AOT: compile the generated kernel for a real TPU topology from shapes only.

``jax.jit(step).trace(*ShapeDtypeStructs).lower().compile()`` runs Mosaic and
the TPU backend (libtpu) with no TPU and no weights. Mosaic errors are
re-raised as EmitError pointing at the generated source line and IR node. The
compiler's scoped VMEM use is read from ``compiled.as_text()``
(``used_scoped_memory_configs`` on the kernel's custom call) and reported next
to the plan's VMEM total.
"""

from __future__ import annotations

import os
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from megakernel import dtypes
from megakernel.errors import EmitError

# Compiling from shapes needs no TPU: let several processes (parallel tests,
# colleagues' tools) load libtpu instead of failing on its lockfile.
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
# On a machine with no TPU chip (jax's import then sets TPU_SKIP_MDS_QUERY)
# libtpu finds neither its host bounds nor worker hostnames and prints errors
# at start-up: say this host is alone. The compile is the same without them.
if os.environ.get("TPU_SKIP_MDS_QUERY"):
    os.environ.setdefault("TPU_HOST_BOUNDS", "1,1,1")
    os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")


@dataclass(frozen=True)
class AotResult:
    vmem_used_bytes: int | None      # the compiler's scoped VMEM use of the kernel
    vmem_limit_bytes: int | None
    plan_vmem_bytes: int             # MemoryPlan.vmem_total
    compile_seconds: float
    topology: str
    copies: tuple[str, ...] = ()     # XLA copies around the kernel, "name dtype[shape]"

    @property
    def copy_bytes(self) -> int:
        """Bytes per core XLA copies around the kernel each call (each copy reads
        and writes them). A kernel with remote DMAs gets its outputs copied out of
        XLA's buffers for it, and its in-place caches copied in; see
        docs/verification.md."""
        return sum(copy_nbytes(c) for c in self.copies)

    def summary(self) -> str:
        mib = 2**20
        used = "?" if self.vmem_used_bytes is None else f"{self.vmem_used_bytes / mib:.2f}"
        text = (f"{self.topology}: compiled in {self.compile_seconds:.1f}s; VMEM used {used} "
                f"MiB (compiler) vs {self.plan_vmem_bytes / mib:.2f} MiB (plan)")
        if self.copies:
            text += (f"; XLA adds {len(self.copies)} copies around the kernel "
                     f"({self.copy_bytes / mib:.1f} MiB per core per call)")
        return text




def copy_nbytes(copy: str) -> int:
    """Bytes of one ``hbm_copies`` entry, e.g. 'copy.3 bf16[64,1,4096,128]'."""
    m = re.search(r"([a-z]+\d*)\[([\d,]*)\]", copy)
    if not m:
        return 0
    dims = [int(d) for d in m.group(2).split(",") if d]
    d = dtypes.HLO.get(m.group(1))
    bits = d.bits if d is not None else 32
    return bits * int(np.prod(dims, dtype=np.int64)) // 8


def topology_mesh(topology: str, cores: int):
    from jax.experimental import topologies

    devices = topologies.get_topology_desc(topology_name=topology, platform="tpu").devices
    if len(devices) < cores:
        raise EmitError(f"topology {topology} has {len(devices)} TensorCores, the plan needs "
                        f"{cores}", path="aot.topology")
    return jax.sharding.Mesh(np.array(devices[:cores]), ("x",))


def scoped_vmem(compiled) -> tuple[int | None, int | None]:
    """(used, limit) bytes of the Mosaic custom call, from the HLO text (the
    first scoped-memory configs after ``custom_call_target="tpu_custom_call"``)."""
    text = compiled.as_text()
    used = limit = None
    for hit in re.finditer(r'custom_call_target="tpu_custom_call"', text):
        tail = text[hit.end():]
        u = re.search(r'"used_scoped_memory_configs":\[\{[^]]*"size":"(\d+)"\}\]', tail)
        lim = re.search(r'"scoped_memory_configs":\[\{[^]]*"size":"(\d+)"\}\]', tail)
        if u:
            used = max(used or 0, int(u.group(1)))
        if lim:
            limit = max(limit or 0, int(lim.group(1)))
    return used, limit


def hbm_copies(compiled) -> list[str]:
    """Whole-array copies XLA inserted around the kernel (layout changes or
    lost aliasing): each is an extra HBM pass per step."""
    return [ln.split("=")[0].strip() + " " + ln.split("=")[1].split("{")[0].strip()
            for ln in compiled.as_text().splitlines()
            if " copy(" in ln and "ENTRY" not in ln]


def abstract_args(module, mesh, cores: int) -> list:
    """The call's operands as shapes (whole arrays, split along the mesh where
    the kernel shards them), in INPUTS order: what a trace or compile needs."""
    args = []
    for _, shape, dtype, _, sharded in module.INPUTS:
        shape = (shape[0] * cores, *shape[1:]) if sharded else shape
        spec = P("x") if sharded else P()
        args.append(jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, spec)))
    return args


def _on_own_stack(fn):
    """``fn()`` on a worker thread, its result or its error returned here.

    Why: CPython 3.12 keeps Python frames in 16 KiB chunks and unmaps a chunk
    as soon as the stack returns below it, so a recursion that goes up and
    down across a chunk's edge maps and unmaps memory on every call. Lowering
    the kernel recurses through its nested loop bodies, and where the edge
    falls depends on how deep the caller already is: Qwen3.5-27B's kernel on
    8 cores lowered in 9-12 s from ``megakernel aot`` against 4.5-5.3 s from a
    shallower caller (perf: the extra time in mmap, munmap and page faults).
    A thread's frames start at the same depth whoever calls, so the compile
    time does not depend on the caller (measured 2026-12-04: 5.3 s)."""
    box = {}

    def run():
        try:
            box["out"] = fn()
        except BaseException as err:  # noqa: BLE001 - re-raised in the caller
            box["err"] = err

    # A daemon: an interrupt ends the caller's wait, and the process exits
    # without waiting for libtpu to finish.
    worker = threading.Thread(target=run, name="megakernel-aot", daemon=True)
    worker.start()
    worker.join()
    if "err" in box:
        raise box["err"]
    return box["out"]


def aot_compile(out_dir_or_module, plan, *, topology: str = "tpu7x:2x2x1",
                with_logits: bool = False, write_back: bool = True) -> AotResult:
    from megakernel.backends.pallas_tpu.codegen import load

    module = out_dir_or_module
    if isinstance(module, (str, Path)):
        path = Path(module)
        module = load.import_module(path / "kernel.py" if path.is_dir() else path)
    mesh = topology_mesh(topology, plan.shard.cores)
    args = abstract_args(module, mesh, plan.shard.cores)
    def build():
        with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
            # Operands laid out as the kernel takes them (a TPU runner puts
            # its arrays, the weights once, in ``compiled.input_formats``):
            # otherwise XLA relays out the [L, 1, n] vectors on every call.
            step = module.make_step(mesh, interpret=False, with_logits=with_logits,
                                    auto_layouts=True, write_back=write_back)
            return step.trace(*args).lower().compile()

    t0 = time.perf_counter()
    try:
        compiled = _on_own_stack(build)
    except Exception as err:  # noqa: BLE001 - re-raised with the generated location
        raise load.located(err, module.__file__, f"AOT compile for {topology}") from err
    seconds = time.perf_counter() - t0
    used, limit = scoped_vmem(compiled)
    return AotResult(used, limit, plan.memory.vmem_total, seconds, topology,
                     tuple(hbm_copies(compiled)))
