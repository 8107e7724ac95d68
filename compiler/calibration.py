"""The generated table of compute rates, measured with the real TPU compiler.

``megakernel calibrate`` AOT-compiles the micro-kernels of
``backends/pallas_tpu/aot/calibration_kernels.py`` for one TPU7x TensorCore, reads
libtpu's static schedule of each (cycles, two sizes per kernel), and calls
``write``: ``derive`` turns the cycle pairs into rates, and the table, with
the raw cycles and a header naming libtpu and the command, goes to
``compiler/calibration.json``. Nothing in that file is typed by hand: every
rate is recomputed from its cycles by a test.

After ``load``: ``Calibration.rate(name)`` is a measured rate with its source,
or a ``PlanningError`` naming the rate and the command that makes it.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path

from megakernel.errors import PlanningError

TABLE = Path(__file__).with_name("calibration.json")
FORMAT = "megakernel.calibration/1"
COMMAND = "megakernel calibrate"
# Shapes of the micro-kernels (calibrate_kernels.py): the slopes below divide by them.
KDIM, SMALL_N, LARGE_N, ROWS_SMALL, ROWS_LARGE, N_ROWS = 2048, 1024, 2048, 1024, 2048, 1024
TILES_SMALL, TILES_LARGE = 8, 16
# The ring-piece probes (calibrate_kernels.ring_piece): tiles of each piece
# width, at two row counts, about RING_ROWS x RING_COLS weights each (qwen3-32b/8's
# tiles are 640 x 3,200). Widths: every whole number of 128 lanes up to four
# MXUs, and wider ones (up to 2,048, whose 128 KiB row chunks still hold 32 rows).
RING_ROWS, RING_COLS = 640, 3072
RING_PIECE_ROWS = (640, 2560)
RING_WIDTHS = (128, 256, 384, 512, 640, 768, 896, 1024, 1536, 2048)
DMA_SMALL, DMA_LARGE = 4 * 2**20, 8 * 2**20
MATMUL_DTYPES = ("bfloat16", "float32", "float8_e4m3fn", "int8", "int4")
_SRC = "libtpu static profile, "


def ring_cols(width: int, rows: int = RING_ROWS) -> int:
    """Columns of the ring-piece probe's tiles of ``rows`` rows at piece
    ``width``: a whole number of pieces (every piece ``width`` wide), the
    tile near RING_ROWS x RING_COLS weights (4 banks of it fit VMEM)."""
    return width * max(1, round(RING_ROWS * RING_COLS / rows / width))


def _slope(measured: dict, name: str) -> float:
    small, large = measured[name]
    if large <= small:
        raise PlanningError(f"calibration kernel {name}: the larger variant took {large} "
                            f"cycles, not more than the smaller's {small}",
                            path=f"calibration.measurements.{name}",
                            hint=f"run `{COMMAND}` again; if it persists the kernel is "
                                 "optimised away")
    return large - small


def derive(measured: dict, bf16_flops: float) -> dict:
    """Rates from the micro-kernels' (small, large) cycles -> {name: {value,
    unit, source}}. ``bf16_flops``: the chip's peak bf16 flop/s (pltpu), which
    with the measured flop/cycle gives the clock the profile is counted in."""
    out = {}

    def put(name, value, unit, source):
        out[name] = {"value": value, "unit": unit, "source": _SRC + source}

    fpc = 2.0 * (ROWS_LARGE - ROWS_SMALL) * KDIM * N_ROWS / _slope(measured, "matmul.rows")
    put("flops_per_cycle", fpc, "flop/cycle",
        f"x[{ROWS_SMALL}->{ROWS_LARGE}, {KDIM}] @ W[{KDIM}, {N_ROWS}] bf16 (flop-bound)")
    clock = bf16_flops / fpc
    put("clock_hz", clock, "Hz", "pltpu bf16 peak flop/s / flops_per_cycle")
    grown = KDIM * (LARGE_N - SMALL_N)
    for dt in MATMUL_DTYPES + ("float32_highest",):
        for lay in ("kn", "nk"):
            key = f"matmul.{dt}.{lay}"
            if key in measured and isinstance(measured[key], list):
                put(f"mxu_weights_per_cycle.{dt}.{lay}", grown / _slope(measured, key),
                    "weight/cycle", f"x[8, {KDIM}] @ W {lay}, N {SMALL_N}->{LARGE_N}, "
                    "weights in VMEM (int formats converted to bf16 there first)")
    for key, cycles in sorted(measured.items()):
        if key.startswith("matmul.q.") and isinstance(cycles, list):
            fmt = key.removeprefix("matmul.q.").removesuffix(".kn")
            put(f"mxu_weights_per_cycle.q.{fmt}.kn", grown / _slope(measured, key),
                "weight/cycle", f"x[8, {KDIM}] @ W {fmt}, N {SMALL_N}->{LARGE_N}: codes and "
                "scales in VMEM through the kernel's own path (dequant.matmul)")
    bf16 = out["mxu_weights_per_cycle.bfloat16.kn"]["value"]
    put("mxu_push_rows", fpc / (2.0 * bf16), "rows",
        "flops_per_cycle / (2 x bf16 weights per cycle): below this many LHS rows a "
        "matmul costs its weight pushes")
    f32 = out.get("mxu_weights_per_cycle.float32.kn", {}).get("value")
    if f32:
        put("f32_matmul_slowdown", bf16 / f32, "x",
            "bf16 / f32 weights per cycle at the kernel's default precision")
    for op in ("rmsnorm", "rope", "argmax"):
        if isinstance(measured.get(op), list):
            put(f"{op}_s", _slope(measured, op) / clock, "s",
                f"one {op} at decode shape (2 chained minus 1), calibrate_kernels.{op}")
    if isinstance(measured.get("rmsnorm"), list):
        put("op_overhead_s", _slope(measured, "rmsnorm") / clock, "s",
            "one RMSNorm of 8 x 4096 f32, the typical small vector op")
    if isinstance(measured.get("tiles"), list):
        put("tile_overhead_s", _slope(measured, "tiles") / (TILES_LARGE - TILES_SMALL) / clock,
            "s", "per streamed 4 KiB tile: wait, issue of the next, its add (serial)")
    for width in RING_WIDTHS:
        keys = [f"ring_piece.{width}.{rows}" for rows in RING_PIECE_ROWS]
        if all(isinstance(measured.get(k), list) for k in keys):
            _ring_piece(put, width, [_slope(measured, k) for k in keys])
    if isinstance(measured.get("dma"), list):
        put("dma_bytes_per_cycle", (DMA_LARGE - DMA_SMALL) / _slope(measured, "dma"),
            "B/cycle", "one HBM->VMEM DMA, 4->8 MiB (the profile's own HBM rate)")
    return out


def _ring_piece(put, width: int, slopes: list[float]) -> None:
    """A piece's cycles as fixed + rows x width / rate, from the probe's cycles
    per piece at the two row counts (each slope: TILES_LARGE - TILES_SMALL
    more tiles)."""
    r0, r1 = RING_PIECE_ROWS
    per = [s / (TILES_LARGE - TILES_SMALL) / (ring_cols(width, r) // width)
           for s, r in zip(slopes, RING_PIECE_ROWS)]
    if per[1] <= per[0]:
        raise PlanningError(f"ring piece {width}: {r1}-row pieces took {per[1]:.1f} cycles, "
                            f"not more than {r0}-row ones ({per[0]:.1f})",
                            path=f"calibration.measurements.ring_piece.{width}",
                            hint=f"run `{COMMAND}` again")
    rate = (r1 - r0) * width / (per[1] - per[0])
    probe = (f"bf16 ring tiles in {width}-column pieces, each its own DMA waited before "
             f"its matmuls, {r0} and {r1} rows (calibrate_kernels.ring_piece)")
    put(f"ring_piece_weights_per_cycle.{width}", rate, "weight/cycle",
        probe + ": cycles per piece over its weights, by rows")
    put(f"ring_piece_cycles.{width}", per[0] - r0 * width / rate, "cycle",
        probe + ": a piece's cycles that do not grow with its rows (wait, issue, result)")


def write(path: Path, measured: dict, bf16_flops: float, *, chip: str, command: str,
          versions: dict) -> dict:
    table = {"format": FORMAT,
             "generated": f"GENERATED by `{command}`: do not edit; rerun the command",
             "command": command, "chip": chip, **versions,
             "measurements": measured, "rates": derive(measured, bf16_flops)}
    Path(path).write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
    load.cache_clear()
    return table


@dataclass(frozen=True)
class Calibration:
    path: str
    header: dict
    measurements: dict
    rates: dict

    def rate(self, name: str) -> float:
        if name not in self.rates:
            raise PlanningError(f"the calibration table {self.path} has no rate {name!r} "
                                f"(it has {len(self.rates)}: {sorted(self.rates)[:6]} ...)",
                                path=f"calibration.rates.{name}",
                                hint=f"run `{COMMAND}` (it measures every rate the cost model "
                                     "reads), or add a micro-kernel that measures it")
        return float(self.rates[name]["value"])

    def source(self, name: str) -> str:
        self.rate(name)
        r = self.rates[name]
        return (f"calibrated: {r['source']} (libtpu {self.header.get('libtpu')}, "
                f"`{self.header.get('command')}`)")

    def weights_per_cycle(self, dtype: str, transposed: bool, where: str) -> float:
        """MXU weight loads per cycle for a weight of ``dtype`` in its layout."""
        name = f"mxu_weights_per_cycle.{dtype}.{'nk' if transposed else 'kn'}"
        if name not in self.rates:
            raise PlanningError(f"no calibrated MXU rate for weights of dtype "
                                f"{dtype!r} ({'[N, K]' if transposed else '[K, N]'} layout)",
                                path=where, hint=f"add the format to calibrate_kernels.KERNELS "
                                                 f"and run `{COMMAND}`")
        return self.rate(name)


@functools.lru_cache(maxsize=4)
def load(path: Path = TABLE) -> Calibration:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise PlanningError(f"cannot read the calibration table {path}: {err}",
                            path="calibration", hint=f"run `{COMMAND}` to generate it") from None
    if data.get("format") != FORMAT:
        raise PlanningError(f"{path} is not a {FORMAT} table (format={data.get('format')!r})",
                            path="calibration.format", hint=f"run `{COMMAND}`")
    header = {k: v for k, v in data.items() if k not in ("measurements", "rates")}
    return Calibration(str(path), header, data["measurements"], data["rates"])
