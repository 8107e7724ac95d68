"""The plan's JSON form, both ways: a plan stands alone.

``encode`` turns a plan (frozen dataclasses, enums, tuples) into JSON values;
``decode`` rebuilds any such record from them, guided by the field types, so
``Plan.from_json(plan.to_json()) == plan`` and the compiled folder's plan.json
is the plan the kernel was generated from, with no re-planning. The model is
carried in its IR form (``ir/serialize.py``); an op library's geometry is
found by its library name (``GEOMETRIES``), in the field a record marks
``BY_LIBRARY`` (``buffers.OpGeometry``). Floats keep their exact repr.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import types
import typing

from megakernel.errors import PlanningError
from megakernel.registry import Registry

# Library name -> its geometry record class (compiler/geometry/<library>.py):
# every kind with a kernel library (``Op.LIBRARY``) needs one under that name.
GEOMETRIES: Registry = Registry("geometry record", "compiler/geometry/<library>.py",
                                per_op_kind=False,
                                needed_by=lambda cls: cls.LIBRARY is not None,
                                need="it has a kernel library", key_of=lambda cls: cls.LIBRARY,
                                keyed_by="kernel library")


OMIT_DEFAULT = "omit_default"
# Field metadata: the field holds the geometry record of the library its record's
# ``library`` field names, whose class is found in GEOMETRIES (buffers.OpGeometry).
BY_LIBRARY = "by_library"


def encode(value):
    from megakernel.ir.graph import Model
    from megakernel.ir.serialize import model_to_dict

    if isinstance(value, Model):
        return model_to_dict(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        # A field added with OMIT_DEFAULT is left out at its default, so plans
        # that do not use it keep their JSON, and their digest, as before.
        return {f.name: encode(getattr(value, f.name)) for f in dataclasses.fields(value)
                if not (f.metadata.get(OMIT_DEFAULT) and getattr(value, f.name) == f.default)}
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, (tuple, list)):
        return [encode(v) for v in value]
    if isinstance(value, dict):
        return {str(k): encode(v) for k, v in value.items()}
    return value


@functools.lru_cache(maxsize=None)
def _hints(cls) -> dict:
    return typing.get_type_hints(cls)


@functools.lru_cache(maxsize=None)
def _by_library(cls) -> str | None:
    """The name of ``cls``'s field marked BY_LIBRARY, if it has one."""
    return next((f.name for f in dataclasses.fields(cls) if f.metadata.get(BY_LIBRARY)), None)


def decode(kind, data, path: str = "plan"):
    """``data`` (JSON values) as a value of type ``kind``."""
    from megakernel.ir.graph import Model
    from megakernel.ir.serialize import model_from_dict

    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if kind is Model:
        return model_from_dict(data)
    if dataclasses.is_dataclass(kind) and (name := _by_library(kind)) is not None:
        record = GEOMETRIES(data["library"], path)
        fields = {k: v for k, v in data.items() if k != name}
        return kind(**fields, **{name: decode(record, data[name], path)})
    if dataclasses.is_dataclass(kind):
        if not isinstance(data, dict):
            raise PlanningError(f"expected an object for {kind.__name__}, found "
                                f"{type(data).__name__}", path=path)
        hints = _hints(kind)
        return kind(**{f.name: decode(hints[f.name], data[f.name], f"{path}.{f.name}")
                       for f in dataclasses.fields(kind) if f.init and f.name in data})
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        return kind(data)
    if origin in (typing.Union, types.UnionType):
        if data is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        for a in inner:          # the first member the value decodes as
            try:
                return decode(a, data, path)
            except (TypeError, ValueError, KeyError, PlanningError):
                continue
        raise PlanningError(f"{data!r} fits none of {inner}", path=path)
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(decode(args[0], v, f"{path}.{i}") for i, v in enumerate(data))
        return tuple(decode(a, v, f"{path}.{i}") for i, (a, v) in enumerate(zip(args, data)))
    if origin is dict:
        return {k: decode(args[1], v, f"{path}.{k}") for k, v in data.items()}
    if kind is float:
        return float(data)
    if kind in (int, str, bool) or kind is typing.Any or kind is object:
        return data
    if isinstance(kind, str):
        raise PlanningError(f"unresolved type {kind!r}", path=path)
    return data
