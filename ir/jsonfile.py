"""Reading a JSON model file as data, with bounds, before any schema sees it.

``read_json(path)`` / ``parse_json(text)`` return the parsed document or raise
an error (``IRError``, or the ``error`` class given) that names the file and,
where there is one, the dotted path inside it. Refused: files over
``limits.MAX_JSON_BYTES``, bytes that are not UTF-8, text that is not JSON,
an object with a key given twice (JSON leaves duplicates undefined; Python
would keep the last one silently) and nesting deeper than
``limits.MAX_JSON_DEPTH``. NaN and Infinity parse (as Python does) so that the
schema can name the field that holds them; string lengths are the schema's
business too (every string field has its own limit, and errors echo values
through ``errors.shown``, which cuts them).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from megakernel.errors import IRError, MegakernelError, shown
from megakernel.ir import limits


class _Duplicated(dict):
    """An object that had keys given more than once (named by ``check_tree``)."""

    duplicates: list[str]


def _pairs(pairs: list[tuple[str, Any]]) -> dict:
    out = dict(pairs)
    if len(out) == len(pairs):
        return out
    seen: set[str] = set()
    dup = _Duplicated(out)
    dup.duplicates = sorted({k for k, _ in pairs if k in seen or seen.add(k)})
    return dup


def parse_json(text: str | bytes, *, source: str = "", error: type[MegakernelError] = IRError,
               max_bytes: int = limits.MAX_JSON_BYTES) -> Any:
    """The document in ``text``; errors are ``error`` with path ``source``."""
    if len(text) > max_bytes:
        raise error(f"{len(text):,} bytes; model files are limited to {max_bytes:,}",
                    path=source, hint="is this the right file?")
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as err:
            raise error(f"not UTF-8 text: byte {err.object[err.start]:#04x} at offset "
                        f"{err.start} cannot be decoded", path=source,
                        hint="save the file as UTF-8 JSON") from None
    try:
        data = json.loads(text, object_pairs_hook=_pairs)
    except json.JSONDecodeError as err:
        raise error(f"not valid JSON: {err.msg} at line {err.lineno} column {err.colno}",
                    path=source, hint="fix the JSON syntax") from None
    except RecursionError:
        raise error(f"nested deeper than Python's JSON reader allows; model files nest "
                    f"at most {limits.MAX_JSON_DEPTH} levels", path=source) from None
    except ValueError as err:
        # e.g. an integer of more than 4300 digits
        raise error(f"not valid JSON: {shown(str(err))}", path=source) from None
    check_tree(data, source=source, error=error)
    return data


def read_json(path: str | Path, *, error: type[MegakernelError] = IRError) -> Any:
    """The document in file ``path``, checked as ``parse_json`` does; the size
    is checked before anything is read."""
    path = Path(path)
    try:
        size = path.stat().st_size
        if size > limits.MAX_JSON_BYTES:
            raise error(f"{size:,} bytes; model files are limited to "
                        f"{limits.MAX_JSON_BYTES:,}", path=str(path),
                        hint="is this the right file?")
        raw = path.read_bytes()
    except OSError as err:
        raise error(f"cannot read: {err.strerror or err}", path=str(path)) from None
    return parse_json(raw, source=str(path), error=error)


_CONTAINERS = (dict, list, _Duplicated)


def check_tree(data: Any, *, source: str = "", error: type[MegakernelError] = IRError) -> None:
    """Depth and duplicate keys of a parsed document, walked level by level
    without recursion (scalars are skipped in C-speed filters); the first
    problem is raised with its dotted path."""
    level, depth = [data], 1
    while level:
        if depth > limits.MAX_JSON_DEPTH:
            raise error(f"nested more than {limits.MAX_JSON_DEPTH} levels deep; model "
                        "files nest at most that", path=_where(source, data, _too_deep))
        nxt: list = []
        for value in level:
            kind = type(value)
            if kind is _Duplicated:
                raise error(f"keys {value.duplicates} appear more than once in one object",
                            path=_where(source, data, lambda v, _: type(v) is _Duplicated),
                            hint="keep one of each: JSON does not say which one counts")
            items = value.values() if kind is not list else value
            nxt.extend(x for x in items if type(x) in _CONTAINERS)
        level, depth = nxt, depth + 1


def _too_deep(value: Any, depth: int) -> bool:
    return depth > limits.MAX_JSON_DEPTH


def _where(source: str, data: Any, found) -> str:
    """``source: dotted.path`` of the first container for which ``found(value,
    depth)`` holds (only run to name an error)."""
    stack: list[tuple[Any, tuple[str, ...]]] = [(data, ())]
    while stack:
        value, keys = stack.pop()
        if found(value, len(keys) + 1):
            path = ".".join(k[:40] for k in keys)
            return f"{source}: {path}" if source and path else source or path
        items = value.items() if isinstance(value, dict) else enumerate(value)
        stack.extend((v, (*keys, str(k))) for k, v in items if type(v) in _CONTAINERS)
    return source
