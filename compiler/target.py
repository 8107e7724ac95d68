"""Targets: a TPU chip kind, a topology of TensorCores, and the cost constants.

After ``make_target``: every capacity and rate of a TensorCore comes from
``pltpu.get_tpu_info_for_chip`` (never typed in here); the VMEM budget is the
capacity minus a reserve left to the compiler for spills; every cost-model
constant sits in ``COST_TABLE`` with the source of its value.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

# The chip table sits below ir/ (megakernel/chips.py); CHIPS stays importable from here.
from megakernel.chips import CHIPS, MAX_CORES, chip_info, chip_version  # noqa: F401
from megakernel.compiler import measured
from megakernel.errors import PlanningError

MiB = 2**20
DEFAULT_VMEM_RESERVE = 6 * MiB


@dataclass(frozen=True)
class Constant:
    value: float
    unit: str
    source: str


_INFERACT = "Inferact/tpu-megakernels README, their TPU7x measurements (platform-facts.md)"

# The one table of cost-model constants. "assumed" means not measured by
# anyone yet: a calibration run on hardware should replace it.
COST_TABLE: dict[str, Constant] = {
    "dma_latency_s": Constant(
        1.0e-6, "s", "assumed: first-byte latency of one HBM->VMEM DMA; every DMA "
        "spends it not moving (compiler/dma_service.py), exposed where nothing else "
        "can run (call start, first layer's vectors, expert fetch after routing)"),
    "tile_overhead_s": Constant(
        0.10e-6, "s", "assumed: scalar-core work per streamed tile (semaphore wait, "
        "next descriptor issue, loop bookkeeping) on the compute path"),
    "op_overhead_s": Constant(
        0.30e-6, "s", "assumed: fixed vector-unit cost of one small op (norm, rope, "
        "residual add, routing) at decode row counts"),
    "hbm_share_per_dma": Constant(0.0, "fraction", "fitted: compiler/measured.py"),
    "hbm_efficiency": Constant(0.0, "fraction", "fitted: compiler/measured.py"),
    "mxu_push_rows": Constant(
        128, "rows", "assumed: weight push makes a decode matmul cost as if it had at "
        "least this many LHS rows; " + _INFERACT + ": 'MXU is weight-push bound at "
        "decode sizes, extra LHS rows nearly free'"),
    "f32_matmul_slowdown": Constant(
        3.0, "x", "assumed: an f32 matmul takes ~3 bf16 MXU passes"),
    "ici_bw_per_core": Constant(0.0, "B/s", "fitted: compiler/measured.py"),
    "core_to_core_bw": Constant(
        663e9, "B/s", "fit of " + _INFERACT + " sibling-core remote copies (101 GB/s at "
        "256 KiB, 610 GB/s at 16 MiB) to latency + bytes/bandwidth"),
    "core_to_core_latency_s": Constant(
        2.2e-6, "s", "same fit as core_to_core_bw"),
    "collective_phase_s": Constant(0.0, "s", "fitted: compiler/measured.py"),
    "ici_hop_latency_s": Constant(
        0.3e-6, "s", "assumed: per ICI hop; the all-reduce fit (compiler/measured.py) "
        "puts the rest of a phase's fixed latency in collective_phase_s"),
    "kernel_launch_s": Constant(
        5.0e-6, "s", "assumed: launch of the one pallas_call plus the start barrier"),
    "vpu_f32_ops_per_s": Constant(
        4.5e12, "op/s", "assumed: 2 vector ALU slots x 8 sublanes x 128 lanes of f32 per "
        "cycle at 2.203 GHz (the clock of platform-facts.md); charges elementwise work "
        "that is not a matmul (the Gated DeltaNet recurrence)"),
}


# Compute constants measured by `megakernel calibrate` (libtpu's static schedule of
# micro-kernels, compiler/calibration.json): their values and sources come from there.
# tile_overhead_s and op_overhead_s stay assumed: the micro-kernels' 0.161 us per tile
# and 0.102 us per norm miss what a real ring tile costs the core (llama-3.2-1b's LM
# head: ~2,500 cycles per tile on the critical path, docs/floors.md), and with them the
# geometry search chose 32 x 1 MiB banks, 1.6x the core work of 16 x 2 MiB per cut.
CALIBRATED = ("mxu_push_rows", "f32_matmul_slowdown")


def _calibrate(table: dict[str, Constant]) -> None:
    from megakernel.compiler import calibration

    cal = calibration.load()
    for name in CALIBRATED:
        table[name] = Constant(cal.rate(name), table[name].unit, cal.source(name))


# Transfer constants fitted to Inferact's published TPU7x microbenchmarks (a ring of
# weight DMAs, four all-reduces), each fit the inverse of the formula that uses it.
def _fit(table: dict[str, Constant]) -> None:
    fitted = {**measured.fit_hbm(table["dma_latency_s"].value),
              **measured.fit_collectives(table["ici_hop_latency_s"].value)}
    for name, (value, source) in fitted.items():
        table[name] = Constant(value, table[name].unit, source)


_calibrate(COST_TABLE)
_fit(COST_TABLE)


@dataclass(frozen=True)
class CostConstants:
    """The values of ``COST_TABLE`` (change one with ``dataclasses.replace``)."""

    dma_latency_s: float
    tile_overhead_s: float
    op_overhead_s: float
    hbm_share_per_dma: float
    hbm_efficiency: float
    mxu_push_rows: float
    f32_matmul_slowdown: float
    ici_bw_per_core: float
    core_to_core_bw: float
    core_to_core_latency_s: float
    collective_phase_s: float
    ici_hop_latency_s: float
    kernel_launch_s: float
    vpu_f32_ops_per_s: float

    @classmethod
    def default(cls) -> "CostConstants":
        return cls(**{name: float(c.value) for name, c in COST_TABLE.items()})


@dataclass(frozen=True)
class Topology:
    """``cores`` TensorCores (JAX devices) on ``chips`` chips of
    ``cores_per_chip``; ``grid`` is the chips' ICI arrangement."""

    cores: int
    cores_per_chip: int
    chips: int
    grid: tuple[int, ...]
    name: str

    @property
    def diameter(self) -> int:
        """Most ICI hops between two chips (torus wrap-around on long axes)."""
        return sum(d // 2 for d in self.grid)

    def same_chip(self, a: int, b: int) -> bool:
        return a // self.cores_per_chip == b // self.cores_per_chip


@dataclass(frozen=True)
class Target:
    """Per-TensorCore capacities and rates (from pltpu), a topology, a VMEM
    reserve and the cost constants."""

    chip: str
    vmem_bytes: int
    smem_bytes: int
    hbm_bytes: int
    hbm_bw: float            # bytes/s per TensorCore
    bf16_flops: float        # per TensorCore
    lanes: int
    sublanes: int
    mxu_size: int
    topology: Topology
    vmem_reserve: int = DEFAULT_VMEM_RESERVE
    constants: CostConstants = field(default_factory=CostConstants.default)
    fp8_flops: float = 0.0   # per TensorCore; 0: no float8 MXU operands (pltpu)
    num_mxus: int = 1        # MXUs per TensorCore, each mxu_size columns wide

    @property
    def piece_cols(self) -> int:
        """The narrowest column piece of a ring tile worth one matmul: as wide as
        every MXU of the core side by side. A piece's matmuls sit between the
        waits for its own DMA, so they cannot overlap the next piece's, and a
        narrower piece leaves MXUs idle. Measured (calibration.json
        ``ring_piece_weights_per_cycle``, libtpu 0.0.51): on TPU7x's two
        256-column MXUs, 256-column pieces load 1,038 weights a cycle, 512-column
        ones 2,091, 1,024-column ones 2,061 (the cost model charges each piece
        its width's rate and fixed cycles: compiler/piece_rates.py)."""
        return self.mxu_size * self.num_mxus

    @property
    def cores(self) -> int:
        return self.topology.cores

    @property
    def vmem_budget(self) -> int:
        """VMEM the plan may use: capacity minus the compiler's spill reserve."""
        return self.vmem_bytes - self.vmem_reserve

    def with_cores(self, cores: int) -> "Target":
        return dataclasses.replace(self, topology=make_topology(self.chip, cores))


_GRIDS = {  # chips -> ICI grid for chips of 2 TensorCores (TPU7x) or 1 (v5e, v6e)
    1: (1, 1, 1), 2: (2, 1, 1), 4: (2, 2, 1), 8: (2, 2, 2), 16: (4, 4, 1), 32: (4, 4, 2)}


def make_topology(chip: str, cores: int) -> Topology:
    if not (isinstance(cores, int) and 1 <= cores <= MAX_CORES):
        raise PlanningError(f"devices={cores!r} must be an integer in 1..{MAX_CORES}",
                            path="target.devices")
    per_chip = chip_version(chip).num_physical_tensor_cores_per_chip
    chips = math.ceil(cores / per_chip)
    grid = _GRIDS.get(chips) or (chips, 1, 1)
    dims = grid if per_chip > 1 else tuple(d for d in grid if d > 1)[:2] or (1, 1)
    return Topology(cores, per_chip, chips, grid, f"{chip}:" + "x".join(map(str, dims)))


def make_target(chip: str = "tpu7x", cores: int = 1, *,
                vmem_reserve: int = DEFAULT_VMEM_RESERVE,
                constants: CostConstants | None = None) -> Target:
    """A target of ``cores`` TensorCores of ``chip`` (``tpu7x``, ``v6e``, ``v5e``)."""
    info = chip_info(chip)
    if not 0 <= vmem_reserve < info.vmem_capacity_bytes:
        raise PlanningError(f"vmem_reserve={vmem_reserve} must be in [0, "
                            f"{info.vmem_capacity_bytes}) bytes", path="target.vmem_reserve")
    return Target(chip=chip, vmem_bytes=info.vmem_capacity_bytes,
                  smem_bytes=info.smem_capacity_bytes, hbm_bytes=info.hbm_capacity_bytes,
                  hbm_bw=float(info.mem_bw_bytes_per_second),
                  bf16_flops=float(info.bf16_ops_per_second), lanes=info.num_lanes,
                  sublanes=info.num_sublanes, mxu_size=info.mxu_column_size,
                  topology=make_topology(chip, cores), vmem_reserve=vmem_reserve,
                  constants=constants or CostConstants.default(),
                  fp8_flops=float(info.fp8_ops_per_second), num_mxus=info.num_mxus)
