"""Read a pre-quantized checkpoint's weights as shipped (models/shipped.py says
which modules are quantized and how they are stored).

``load`` gives one IR weight through the checkpoint's ordinary rule
(models/checkpoint.py: transposes, row splits, the rope permutation, expert
stacking), which sees the checkpoint through a ``View``:

* the weight's format is the one its module ships in: the rule runs twice,
  once on the codes (one per weight, HF [out, in]) and once on the scales
  (one per output row and input group, [out, in / g]); every rule only moves
  whole rows and columns and never cuts the input dimension, so codes and
  scales come out in the IR's [..., K, N] and [..., K/g, N] as a
  ``quantize.Packed`` whose codes are exactly the shipped ones;
* the weight's format is plain (a kind the kernel reads plain, like MLA's
  up-projections, or one the card leaves plain): the rule sees code x scale
  in f32, which ``load_checkpoint`` rounds to the model dtype, the rounding
  the kernel applies to a packed weight;
* the module ships as a float weight: quantized on load as before.

A module shipped in another format than the weight's is an error: the
codes would be rounded a second time. Every tensor is checked on the way
(``shipped_scales.from_shipped``: scale shapes, zero / NaN / infinite scales, E8M0
bytes 0 and 255, NaN e4m3 codes), errors naming the checkpoint tensor.

``card_table`` gives the card's ``quantize`` table of a quantized config: a
weight kind gets the format its modules ship in when all of them ship in it.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from megakernel import formats
from megakernel.errors import ConfigError, IRError
from megakernel.ir.types import ParamSpec
from megakernel.models.checkpoint_families import family_tables
from megakernel.models.checkpoint_names import LAYER_PREFIX, PREFIXES, weight_sources
from megakernel.models.shipped import Layout, Scheme
from megakernel.quantize import Packed, decode_np
from megakernel.shipped_scales import from_shipped

# The kinds whose kernel path reads formats (formats.PLAIN_ONLY and the
# planner's refusal of a quantized LM head keep the others plain).
CHOSEN_KINDS = ("dense", "experts")


def _oriented(layout: Layout, a: np.ndarray) -> np.ndarray:
    """An IR-oriented [..., K, N] array as the float tensor lies: [..., out,
    in] (Hugging Face linears) or as it is (``in_out``: gpt-oss experts)."""
    return a if layout.in_out else np.swapaxes(a, -1, -2)


class View:
    """The checkpoint as one IR weight's rule sees it (``has``, ``shape``,
    ``get``), its quantized tensors given as ``mode`` says: "codes", "scales"
    or "values" (dequantized, f32), each in its float tensor's orientation.
    ``seen`` records each name the rule read and its layout (None: a float
    tensor)."""

    def __init__(self, files, scheme: Scheme, kind: str | None, mode: str,
                 fmt: formats.Format = formats.PLAIN):
        self.files, self.scheme, self.kind, self.mode, self.fmt = files, scheme, kind, mode, fmt
        self.seen: dict[str, Layout | None] = {}
        self.shaped: set[str] = set()       # quantized tensors whose shape was asked
        self._packed: dict[str, Packed] = {}

    def has(self, name: str) -> bool:
        where = self.scheme.locate(name, self.kind)
        return self.files.has(name) or (
            where is not None and self.files.has(where[2].names(*where[:2])[0]))

    def shape(self, name: str) -> tuple[int, ...]:
        where = self.scheme.locate(name, self.kind)
        if where is None:
            return self.files.shape(name)
        self.shaped.add(name)
        layout = where[2]
        *lead, out, width = _logical_shape(self.files, *where)
        if self.mode == "scales":
            width //= self.fmt.group(width)
        return (*lead, width, out) if layout.in_out else (*lead, out, width)

    def get(self, name: str) -> np.ndarray:
        where = self.scheme.locate(name, self.kind)
        layout = None if where is None else where[2]
        self.seen[name] = layout
        if layout is None:
            return self.files.get(name)
        if self.mode != "values" and layout.fmt != self.fmt.name:
            raise ConfigError(f"{name} ships as {layout.fmt} ({layout.method}) but the card "
                              f"makes this weight {self.fmt.name}: its codes would be rounded "
                              "a second time", path="checkpoint",
                              hint=f"use --quantize KIND={layout.fmt} (keeps the shipped "
                              "codes) or KIND=plain (dequantizes them)")
        if name not in self._packed:
            self._packed[name] = _read_packed(self.files, *where)
        p = self._packed[name]
        if self.mode == "codes":
            return _oriented(layout, p.codes)
        if self.mode == "scales":
            return _oriented(layout, p.scales)
        width = _logical_shape(self.files, *where)[-1]
        values = decode_np(p) * np.repeat(p.scales, p.group(), axis=-2)
        return _oriented(layout, values[..., :width, :])


def load(files, scheme: Scheme, weight: str, kind: str | None, spec: ParamSpec, dtype: str,
         run):
    """IR weight ``weight`` of ``spec`` (weight kind ``kind``), ``run(view,
    spec)`` being its checkpoint rule: a ``Packed`` when its modules ship in
    the weight's format, else an array (dequantized or float)."""
    fmt = formats.get(spec.format)
    if fmt.plain:
        return _run(run, View(files, scheme, kind, "values"), spec)
    view = View(files, scheme, kind, "codes", fmt)
    codes = _run(run, view, spec)
    shipped = sorted(n for n, lay in view.seen.items() if lay is not None)
    if not shipped:
        return codes                     # float weights, quantized on load
    floats = sorted(n for n, lay in view.seen.items() if lay is None)
    if floats:
        raise ConfigError(f"one weight from tensors of which {shipped[:3]} ship quantized and "
                          f"{floats[:3]} do not", path=weight,
                          hint="quantize all of them (config_groups / ignore) or none")
    k = spec.shape[-2]
    view.mode = "scales"
    scales = run(view, dataclasses.replace(
        spec, shape=(*spec.shape[:-2], k // fmt.group(k), spec.shape[-1])))
    return Packed(fmt, np.ascontiguousarray(codes), np.ascontiguousarray(scales, np.float32),
                  dtype)


def _run(run, view: View, spec: ParamSpec):
    """``run(view, spec)``; a shape error about a packed module says where its
    shape comes from."""
    try:
        return run(view, spec)
    except ConfigError as err:
        if not any(err.message.startswith(f"{n} has shape") for n in view.shaped):
            raise
        raise ConfigError(err.message, path=err.path, hint=(err.hint + "; " if err.hint else "")
                          + f"the [out, in] of {sorted(view.shaped)[0]} is its codes' shape "
                          "(and weight_shape tensor)") from None


def _logical_shape(files, module: str, stem: str, layout: Layout) -> tuple[int, ...]:
    """[..., out, in] of a quantized tensor: its codes' shape times the codes
    per element, checked against its shape tensor when it has one."""
    codes, _, name = layout.names(module, stem)
    if not files.has(codes):
        plain = f"{module}.{stem}"
        found = f"; the checkpoint has {plain} {files.tensors[plain].dtype}" \
            if files.has(plain) else ""
        what = module if stem == "weight" else plain
        raise ConfigError(f"{codes} is missing: quantization_config makes {what} "
                          f"{layout.fmt} ({layout.method}){found}", path="checkpoint",
                          hint="the config's targets / ignore do not describe this "
                          "checkpoint's tensors")
    shape = files.shape(codes)
    if len(shape) != layout.ndim + bool(layout.blocks) or (
            layout.blocks and shape[-1] != layout.blocks):
        raise ConfigError(f"{codes} has shape {list(shape)}, expected {layout.stored()}",
                          path="checkpoint")
    if layout.blocks:
        shape = (*shape[:-2], shape[-2] * shape[-1])
    *lead, out, stored = shape
    width = stored * layout.per
    if name and files.has(name):
        given = files.get_coded(name, ("I64", "I32"), "shape")
        if given.shape != (2,) or given[0] != out or -(-int(given[1]) // layout.per) != stored:
            raise ConfigError(f"{name} is {given.tolist()}, but {codes} {list(shape)} holds "
                              f"[{out}, up to {width}] weights", path="checkpoint",
                              hint="the checkpoint is corrupt")
        width = int(given[1])
    elif layout.shape_required:
        raise ConfigError(f"{name} is missing ({layout.method} stores the unpacked [out, in] "
                          "of each packed weight there)", path="checkpoint")
    return (*lead, out, width)


def _read_packed(files, module: str, stem: str, layout: Layout) -> Packed:
    """The tensor's codes and scales in the IR's orientation ([..., in, out]
    and [..., in / g, out]), checked by ``shipped_scales.from_shipped``."""
    fmt = formats.get(layout.fmt)
    width = _logical_shape(files, module, stem, layout)[-1]
    codes_name, scale_name, _ = layout.names(module, stem)
    if not files.has(scale_name):
        raise ConfigError(f"{scale_name} is missing: {codes_name} ships {layout.fmt} codes "
                          "and needs its scales", path="checkpoint",
                          hint="the checkpoint is incomplete")
    codes = layout.unpack(files.get_coded(codes_name, layout.code_dtypes, "codes"), width)
    # A partial last scale group (fp8 blocks allow one: in = 1000 has 8
    # blocks, the last of 104 inputs) is padded with zero codes; only its
    # values are used (the kernel formats need whole groups, formats.check).
    short = -width % fmt.group_rows if fmt.group_rows else 0
    codes = np.pad(codes, [(0, 0)] * (codes.ndim - 1) + [(0, short)])
    scales = files.get_coded(scale_name, layout.scale_dtypes, "scales")
    try:
        # from_shipped checks the scales' shape and values; int8's per-channel
        # scales ship as [out, 1], i.e. [1, out] in the IR's orientation.
        return from_shipped(fmt, np.swapaxes(codes, -1, -2), np.swapaxes(np.asarray(scales), -1, -2),
                            scale_name, codes_name=codes_name, transposed=True,
                            global_scale=_global_scale(files, module, layout),
                            global_name=f"{module}.{layout.global_scale}",
                            global_divides=layout.global_divides)
    except ConfigError as err:
        raise ConfigError(f"{err.path}: {err.message}", path="checkpoint",
                          hint=err.hint) from None


def _global_scale(files, module: str, layout: Layout):
    """The f32 scale over a module's block scales (nvfp4), or None when its
    layout has none; a layout that needs one and finds none is named."""
    if not layout.global_scale:
        return None
    name = f"{module}.{layout.global_scale}"
    if not files.has(name):
        raise ConfigError(f"{name} is missing: {layout.fmt} block scales need the module's "
                          "global scale", path="checkpoint", hint="the checkpoint is incomplete")
    return files.get_coded(name, ("F32",), "global scale")


def weight_kinds(model) -> dict[str, str]:
    """{IR weight name: weight kind} of every matrix of ``model``."""
    from megakernel.ir.weight_kinds import WEIGHT_KINDS

    kinds = {"embed.weight": "embedding", "lm_head.weight": "lm_head"}
    for i, layer in enumerate(model.layers):
        for n in layer.nodes:
            for pname, kind in WEIGHT_KINDS(n.op.kind, n.name)(n.op).items():
                kinds[f"layers.{i}.{n.name}.{pname}"] = kind
    return kinds


def card_table(scheme: Scheme, model, config: dict) -> tuple[dict[str, str], list[str]]:
    """({weight kind: format} for the card of a checkpoint quantized as
    ``scheme``, notes): dense and experts get the format every module of
    theirs ships in. A kind some of whose modules ship as floats, or in two
    formats, stays plain: its shipped modules are dequantized on load. So does
    a kind one of whose weights the format cannot hold in the kernel
    (``Format.check``: fp8 blocks cut short at the end of the inputs); each
    such kind gives one note saying so. Each IR weight's modules are its
    checkpoint names (every alternative the loader tries)."""
    names, _ = family_tables(config["model_type"], config, model)
    specs = model.params()
    found: dict[str, set] = {k: set() for k in CHOSEN_KINDS}
    of_kind: dict[str, list[str]] = {k: [] for k in CHOSEN_KINDS}
    for weight, kind in weight_kinds(model).items():
        if kind not in found or weight not in specs:
            continue
        of_kind[kind].append(weight)
        sources, layer = weight_sources(names, weight)
        prefixes = ("",) if layer is None else tuple(
            p.format(i=layer) for p in PREFIXES.get(config["model_type"], (LAYER_PREFIX,)))
        for name in (p + s.name for p in prefixes for s in sources):
            experts = range(specs[weight].shape[0]) if "{e}" in name else (None,)
            for e in experts:
                tensor = name if e is None else name.format(e=e)
                where = scheme.locate(tensor, kind)
                if where is not None or tensor.endswith(".weight"):
                    found[kind].add(None if where is None else where[2].fmt)
    table = {k: f.pop() for k, f in found.items() if len(f) == 1 and None not in f}
    notes = []
    for kind, name in list(table.items()):
        fmt = formats.get(name)
        for weight in of_kind[kind]:
            try:
                fmt.check(specs[weight].shape, weight)
            except IRError as err:
                del table[kind]
                notes.append(f"{kind} weights ship as {name} but stay {model.dtype.value}: "
                             f"{err.path}: {err.message}; the shipped values are "
                             "dequantized on load")
                break
    return table, notes
