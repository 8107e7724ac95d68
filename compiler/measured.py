"""The published TPU7x microbenchmarks, and the transfer constants fitted to them.

Every figure in ``MEASURED`` was measured by Inferact on TPU7x and published in
Inferact/tpu-megakernels (``musespark/README.md`` sections 1, 5 and 7). They are component benchmarks
(a ring of weight DMAs, one all-reduce), never a whole decode step: the step
times the cost model predicts for their kernel are checked against, not fitted
to.

After import: ``FITTED`` holds, for each cost constant these benchmarks set, a
``(value, source)`` pair; compiler/target.py puts them in ``COST_TABLE``. Each
fit inverts the cost model's own formula (``dma_service.bandwidth``,
``schedule_collectives.phase_seconds``); tests/compiler/test_measured.py runs
those formulas forward at the fitted values against the measurements.
"""

from __future__ import annotations

from dataclasses import dataclass

MiB = 2**20
_SRC = "Inferact/tpu-megakernels musespark/README.md"


@dataclass(frozen=True)
class Measurement:
    what: str
    value: float
    unit: str
    source: str


MEASURED = {
    "hbm_sustained": Measurement(
        "sustained HBM read per TPU7x core", 3.2e12, "B/s", f"{_SRC} sections 10, 12"),
    # 16 real-width layers of Muse Spark's bf16 dense projections, 76 MiB per layer,
    # through a 12-bank ring of 2 MiB tiles: DMA-bound.
    "ring_layer_s": Measurement(
        "one layer's 76 MiB through 12 x 2 MiB ring banks", 26.4e-6, "s",
        f"{_SRC} section 5 (their stream test, 16 layers on chip)"),
    # All-reduce (reduce-scatter + all-gather: two phases) on 8 cores, 4 chips.
    "allreduce_8x8192_bf16": Measurement("all-reduce [8, 8192], bf16 wire", 7.3e-6, "s",
                                         f"{_SRC} section 7 (perf_log E1/E3)"),
    "allreduce_8x8192_f32": Measurement("all-reduce [8, 8192], f32 wire", 9.4e-6, "s",
                                        f"{_SRC} section 7"),
    "allreduce_64x4096_bf16": Measurement("all-reduce [64, 4096], bf16 wire", 14.5e-6, "s",
                                          f"{_SRC} section 7"),
    "allreduce_64x4096_f32": Measurement("all-reduce [64, 4096], f32 wire", 25.4e-6, "s",
                                         f"{_SRC} section 7"),
}

# pltpu's HBM bandwidth of one TPU7x TensorCore (Inferact: 3.69 nominal, 7.38 per
# chip). Written here so that importing the cost table needs no jax;
# tests/compiler/test_measured.py checks it against pltpu.get_tpu_info_for_chip.
TPU7X_NOMINAL_BW = 3.7e12
RING_BANKS, RING_BANK_BYTES, RING_LAYER_BYTES = 12, 2 * MiB, 76 * MiB
# (rows, columns, wire bytes) of each all-reduce benchmark
ALLREDUCES = {"allreduce_8x8192_bf16": (8, 8192, 2), "allreduce_8x8192_f32": (8, 8192, 4),
              "allreduce_64x4096_bf16": (64, 4096, 2), "allreduce_64x4096_f32": (64, 4096, 4)}
CORES, CHIPS, DIAMETER = 8, 4, 2     # tpu7x:2x2x1: two hops across the 2 x 2 grid


def ring_rate() -> float:
    """Bytes/s the benchmark's ring streamed (76 MiB in 26.4 us: 3.02 TB/s)."""
    return RING_LAYER_BYTES / MEASURED["ring_layer_s"].value


def fit_hbm(dma_latency_s: float, nominal_bw: float = TPU7X_NOMINAL_BW
            ) -> dict[str, tuple[float, str]]:
    """``hbm_efficiency``: the sustained rate over the chip's nominal one (pltpu's
    3.7 TB/s per TensorCore). ``hbm_share_per_dma``: the per-DMA share that makes
    the ring the benchmark ran (its 12 banks keep 11 DMAs in flight,
    ``dma_service.ring_in_flight``; each spends ``dma_latency_s`` before moving)
    stream at the measured 3.02 TB/s, by ``dma_service.bandwidth``'s Little's law,
    n b / (latency + b / (sustained x share)), solved for share."""
    sustained = MEASURED["hbm_sustained"].value
    n, b = RING_BANKS - 1, RING_BANK_BYTES
    share = b / (sustained * (n * b / ring_rate() - dma_latency_s))
    return {
        "hbm_efficiency": (sustained / nominal_bw, (
            f"fit: {sustained / 1e12:.1f} TB/s sustained per core ({_SRC}) over pltpu's "
            f"{nominal_bw / 1e12:.2f} TB/s nominal (compiler/measured.py)")),
        "hbm_share_per_dma": (share, (
            f"fit: a ring of {RING_BANKS} x 2 MiB banks ({n} DMAs in flight) streams "
            f"{ring_rate() / 1e12:.2f} TB/s, 76 MiB per 26.4 us ({_SRC} section 5), "
            f"with dma_latency_s {dma_latency_s * 1e6:.1f} us (compiler/measured.py)")),
    }


def fit_collectives(hop_latency_s: float) -> dict[str, tuple[float, str]]:
    """``collective_phase_s`` and ``ici_bw_per_core``: the least-squares line
    through the four all-reduce benchmarks, each two phases of
    ``phase_seconds``' ICI form, latency + diameter x hop + remote peers x bytes
    per peer / bandwidth (every core sends its chunk of rows x columns / 8 to
    the 6 cores on other chips; the sibling copy is the shorter one)."""
    xs, ys = [], []
    for name, (rows, cols, item) in ALLREDUCES.items():
        per_peer = rows * (cols // CORES) * item
        xs.append((CORES - CORES // CHIPS) * per_peer)
        ys.append(MEASURED[name].value / 2)
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = (sum((x - mx) * (y - my) for x, y in zip(xs, ys))
             / sum((x - mx) ** 2 for x in xs))
    fixed = my - slope * mx
    src = ("least-squares fit of the 4 all-reduce benchmarks ([8, 8192] and [64, 4096], "
           f"bf16 and f32 wire: 7.3 / 9.4 / 14.5 / 25.4 us; {_SRC} section 7) as two "
           "phases each (compiler/measured.py)")
    return {"collective_phase_s": (fixed - DIAMETER * hop_latency_s, f"{src}: intercept "
                                   f"{fixed * 1e6:.2f} us less {DIAMETER} hops"),
            "ici_bw_per_core": (1.0 / slope, f"{src}: slope")}
