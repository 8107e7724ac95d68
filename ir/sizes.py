"""Size arithmetic from the numbers alone: weight bytes, KV-cache bytes, HBM per core.

Run before any graph, array or plan is built, so that a model that cannot fit
any supported topology (``chips.MAX_CORES`` TensorCores of the chip with the
most HBM per core, capacities from ``pltpu`` as ``megakernel/chips.py`` reads
them) is refused in milliseconds with the figures, instead of after
minutes of building and tiling. ``of_config`` works from a card,
``of_layers`` / ``of_model`` from built layers' param specs; both give the same
``Sizes`` (tests/ir/test_strict_files.py). A lower bound is all this claims: the
planner adds padding, outputs and replicated tensors on top.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from megakernel import chips
from megakernel.errors import IRError, MegakernelError
from megakernel.ir.card import FFNS, MIXERS, ModelConfig
from megakernel.ir.types import DType

if TYPE_CHECKING:
    from megakernel.ir.graph import Layer, Model


@dataclass(frozen=True)
class Sizes:
    """``param_bytes`` of every weight; ``cache_bytes`` of the state one sequence
    keeps: KV and latent caches of ``max_seq_len`` positions and recurrent states."""

    name: str
    param_bytes: int
    cache_bytes: int
    max_seq_len: int

    def total(self, batch: int = 1) -> int:
        return self.param_bytes + batch * self.cache_bytes


def of_config(c: "ModelConfig") -> Sizes:
    """The sizes of the model ``build(c)`` would make, by arithmetic only: each
    layer's mixer and FFN by their own formulas (``Mixer.sizes``, ``FFN.sizes``,
    registered with their blocks)."""
    kinds = [(c.mixer(i), c.layer_kind(i)) for i in range(c.num_layers)]
    mixer = {a: MIXERS(a).sizes(c) for a in dict.fromkeys(a for a, _ in kinds)}
    ffn = {f: FFNS(f).sizes(c) for f in dict.fromkeys(f for _, f in kinds)}
    layers = sum(mixer[a][0] + ffn[f] + residual_gates(c) for a, f in kinds)
    embed = c.vocab_size * c.hidden_size * (1 if c.tie_embeddings else 2) + c.hidden_size
    cache = sum(mixer[a][1] for a, _ in kinds)
    return Sizes(c.name, layers + embed * item_size(c), cache, c.max_seq_len)


def item_size(c: "ModelConfig") -> int:
    """Bytes of one value of the card's dtype."""
    return DType.parse(c.dtype).itemsize


def block_norms(c: "ModelConfig") -> int:
    """Weights of the norms around a layer's mixer and FFN (each hidden-wide;
    a parameter-free post-attention norm has none, an input-scaled post-FFN
    norm its input scale)."""
    post = c.post_norms * (c.post_attn_norm_weight + 1)
    return c.hidden_size * (2 * c.pre_norms + post)


def residual_gates(c: "ModelConfig") -> int:
    """Bytes of one layer's two residual gates (f32 vectors), if the card has them."""
    return 2 * c.hidden_size * 4 * (c.residual_gate_temperature is not None)


def of_layers(name: str, vocab_size: int, hidden_size: int, layers: Sequence["Layer"],
              tie_embeddings: bool, dtype: DType, max_seq_len: int) -> Sizes:
    """The sizes of a model of these parts, from each distinct layer's param and
    state specs (appended state at ``max_seq_len`` rows, whole state as declared)."""
    per_layer: dict = {}
    for layer in layers:
        if layer not in per_layer:
            params = sum(s.nbytes for s in layer.params(dtype).values())
            cache = sum(spec.nbytes for n in layer.nodes       # one sequence's state
                        for spec in n.op.state(1, max_seq_len, dtype).values())
            per_layer[layer] = (params, cache)
    params = sum(per_layer[layer][0] for layer in layers)
    cache = sum(per_layer[layer][1] for layer in layers)
    embed = vocab_size * hidden_size * (1 if tie_embeddings else 2) + hidden_size
    return Sizes(name, params + embed * dtype.itemsize, cache, max_seq_len)


def of_model(model: "Model", *, formatted: bool = False) -> Sizes:
    """The sizes of ``model`` (as ``of_config`` of its card: weights in the
    model dtype); ``formatted``: its weights in their storage formats
    (megakernel/formats.py), what the planner holds in HBM."""
    sizes = of_layers(model.name, model.vocab_size, model.hidden_size, model.layers,
                      model.tie_embeddings, model.dtype, model.max_seq_len)
    if formatted and model.quantize.chosen():
        sizes = dataclasses.replace(sizes, param_bytes=sum(
            p.nbytes for p in model.params().values()))
    return sizes


@functools.lru_cache(maxsize=None)
def largest_topology() -> tuple[str, int, int]:
    """(chip, cores, HBM bytes per core) of the supported topology with the most HBM."""
    chip = max(chips.CHIPS, key=chips.hbm_bytes)
    return chip, chips.MAX_CORES, chips.hbm_bytes(chip)


def check_fits(sizes: Sizes, *, cores: int | None = None, hbm_per_core: int | None = None,
               chip: str | None = None, batch: int = 1, path: str = "sizes",
               error: type[MegakernelError] = IRError, quantize: str = "") -> None:
    """Refuse ``sizes`` when weights plus the KV caches of ``batch`` sequences,
    split evenly, exceed ``cores`` x ``hbm_per_core`` (default: the largest
    supported topology). ``quantize``: a ``--quantize KIND=FORMAT`` the hint
    offers (a weight kind the model stores plain)."""
    if cores is None or hbm_per_core is None:
        chip, cores, hbm_per_core = largest_topology()
    need = sizes.total(batch)
    if need <= cores * hbm_per_core:
        return
    raise error(
        f"{sizes.name} has {_gb(sizes.param_bytes)} of weights + {_gb(batch * sizes.cache_bytes)} "
        f"of KV caches ({batch} sequence(s) x {sizes.max_seq_len:,} positions) = {_gb(need)}: "
        f"at least {_gb(need / cores)} of HBM per core, capacity {_gb(hbm_per_core)} "
        f"({chip or 'target'}, {cores} TensorCore(s), split evenly)", path=path,
        hint="use smaller sizes, fewer layers, or a shorter max_seq_len or batch" + (
            f", or more TensorCores (at most {_max_cores()})" if cores < _max_cores() else "")
        + (f", or store weights in fewer bytes: --quantize {quantize} (docs/formats.md)"
           if quantize else ""))


def _max_cores() -> int:
    return largest_topology()[1]


def _gb(nbytes: float) -> str:
    return f"{nbytes / 1e9:,.1f} GB"

