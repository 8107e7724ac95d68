"""The chip table: the TPU chips a kernel can target, the most TensorCores a
topology may have, and what ``pltpu`` says each chip's TensorCore holds.

A base module, below ir/ and compiler/: ir/sizes.py refuses a model too large
for the biggest supported topology from these figures, and compiler/target.py
builds its targets from them. Capacities and rates are never typed in here;
they come from ``pltpu.get_tpu_info_for_chip``, imported only when a chip is
first looked up, so that importing this module does not pull in jax.
"""

from __future__ import annotations

import functools

from megakernel.errors import EmitError, PlanningError

MAX_CORES = 32

# Short chip names users type -> pltpu.ChipVersion member names.
CHIPS = {"tpu7x": "TPU_7X", "v6e": "TPU_V6E", "v5e": "TPU_V5E"}


def chip_version(chip: str):
    """The ``pltpu.ChipVersion`` of ``chip`` (a key of ``CHIPS``)."""
    from jax.experimental.pallas import tpu as pltpu

    if chip not in CHIPS:
        raise PlanningError(f"chip={chip!r} is not supported; supported: {sorted(CHIPS)}",
                            path="target.chip")
    return getattr(pltpu.ChipVersion, CHIPS[chip])


@functools.lru_cache(maxsize=None)
def chip_info(chip: str):
    """``pltpu``'s capacities and rates of one TensorCore of ``chip``."""
    from jax.experimental.pallas import tpu as pltpu

    # Per TensorCore: on TPU7x each TensorCore is its own device, so 1.
    return pltpu.get_tpu_info_for_chip(chip_version(chip), 1)


def hbm_bytes(chip: str) -> int:
    """HBM capacity of one TensorCore of ``chip``."""
    return chip_info(chip).hbm_capacity_bytes


# TPU topologies libtpu 0.0.51 compiles for from shapes (tried one by one), and
# their TensorCores. Other names it either rejects or cannot lay out on one host.
TOPOLOGIES = {
    "tpu7x:1x1x1": 2, "tpu7x:2x1x1": 4, "tpu7x:2x2x1": 8, "tpu7x:2x2x2": 16,
    "tpu7x:4x4x1": 32, "tpu7x:4x4x2": 64,
    "v6e:1x1": 1, "v6e:2x2": 4, "v6e:4x4": 16,
    "v5e:1x1": 1, "v5e:2x2": 4, "v5e:4x4": 16,
}


def check_topology(topology: str, chip: str, cores: int) -> None:
    """The AOT topology is one of ``chip``'s, with at least ``cores`` TensorCores."""
    fitting = [t for t, n in TOPOLOGIES.items() if t.split(":")[0] == chip and n >= cores]
    if topology not in fitting:
        raise EmitError(f"{topology} ({TOPOLOGIES[topology]} TensorCores) does not "
                        f"fit a plan for {cores} {chip} TensorCore(s)", path="--topology",
                        hint=f"give one of {', '.join(fitting) or 'none'}")
