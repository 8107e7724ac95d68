"""Field types and the pydantic glue that checks every IR record when it is built.

Every card, op, tensor and graph record is a frozen *pydantic dataclass*
(``@node``): construction from JSON or from Python validates each field against
its annotated type, so a record holds a real bool, int, finite float, enum or
identifier string, or it does not exist. Scalars are strict (no ``"false"`` ->
True, no ``"256"`` -> 256, no 256.5 -> 256); containers are lax only in the
harmless direction (a JSON list becomes a tuple, a JSON object a nested record).
Pydantic's errors are turned into one ``IRError`` naming each field by its dotted
path, what was expected and what was found (docs/validation.md).
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import keyword
import re
from typing import Annotated, Any

from pydantic import AfterValidator, ConfigDict, Field, Strict, StrictBool, TypeAdapter, ValidationError
from pydantic.dataclasses import dataclass as pydantic_dataclass

from megakernel.errors import IRError, MegakernelError, shown
from megakernel.ir import limits

# extra="forbid": unknown keyword arguments (JSON keys) are errors, all listed.
NODE_CONFIG = ConfigDict(extra="forbid", allow_inf_nan=False, strict=False,
                         str_max_length=limits.MAX_JSON_STRING)

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_MODEL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*")


def _identifier(name: str) -> str:
    # fullmatch, not `^...$`: `$` also matches before a trailing newline.
    if not _IDENT.fullmatch(name):
        # A noun phrase: the error reads "expected <this>, found <value>".
        raise ValueError("a name of ASCII letters, digits and _, not starting with a digit")
    if keyword.iskeyword(name) or (name.startswith("__") and name.endswith("__")):
        raise ValueError("a name that is not a Python keyword or a __dunder__ name")
    return name


def _model_name(name: str) -> str:
    if not _MODEL_NAME.fullmatch(name):
        raise ValueError("a name of ASCII letters, digits, '-', '.' and _, "
                         "starting with a letter or _")
    _identifier(name.replace("-", "_").replace(".", "_"))
    return name


def Int(low: int, high: int):
    """An exact integer in [low, high] (bools and floats refused)."""
    return Annotated[int, Strict(), Field(ge=low, le=high)]


def Float(low: float | None = None, high: float | None = None, *, open_low: bool = False):
    """A finite number in [low, high] (``(low, high]`` with ``open_low``); an
    integer is taken as a float, a bool or a string is refused."""
    bounds: dict[str, float] = {}
    if low is not None:
        bounds["gt" if open_low else "ge"] = low
    if high is not None:
        bounds["le"] = high
    return Annotated[float, Strict(), Field(allow_inf_nan=False, **bounds)]


Bool = StrictBool
Identifier = Annotated[str, Strict(), Field(min_length=1, max_length=limits.MAX_NAME_CHARS),
                       AfterValidator(_identifier)]
ModelName = Annotated[str, Strict(), Field(min_length=1, max_length=limits.MAX_NAME_CHARS),
                      AfterValidator(_model_name)]
# A word that is checked against a table later (dtype, activation, scoring).
Word = Annotated[str, Strict(), Field(min_length=1, max_length=limits.MAX_ENUM_CHARS)]
AnyFloat = Float()


def node(cls):
    """Make ``cls`` a frozen pydantic dataclass whose construction raises
    ``IRError`` (naming the field) instead of pydantic's ``ValidationError``.

    A class with ``FLAT_ERRORS = True`` (the ops) keeps the error's path at
    itself and starts the message with the field (``layers.0.mlp: activation:
    expected ...``): the path then names the op the way docs/ir.md shows it."""
    cls = pydantic_dataclass(frozen=True, config=NODE_CONFIG)(cls)
    init = cls.__init__
    names = tuple(f.name for f in dataclasses.fields(cls))
    what = repr(cls.kind) if isinstance(getattr(cls, "kind", None), str) else cls.__name__
    flat = getattr(cls, "FLAT_ERRORS", False)
    prefix = getattr(cls, "ERROR_PATH", "")

    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        try:
            init(self, *args, **kwargs)
        except ValidationError as err:
            error = ir_error(err, names, what)
            if flat and error.path:
                error = type(error)(f"{error.path}: {error.message}", hint=error.hint)
            raise (error.prefixed(prefix) if prefix else error) from None

    cls.__init__ = __init__
    return cls


@functools.lru_cache(maxsize=None)
def adapter(annotation) -> TypeAdapter:
    return TypeAdapter(annotation, config=NODE_CONFIG if _is_plain(annotation) else None)


def _is_plain(annotation) -> bool:
    # TypeAdapter takes a config only for types that do not carry their own.
    return not (dataclasses.is_dataclass(annotation) or hasattr(annotation, "__pydantic_config__"))


def check(annotation, value: Any, *, path: str = "", error: type[MegakernelError] = IRError):
    """``value`` validated as ``annotation``; errors are ``error`` at ``path``."""
    try:
        return adapter(annotation).validate_python(value)
    except ValidationError as err:
        failure = ir_error(err, (), "", error)
    raise failure.prefixed(path) if path else failure


# What each pydantic error type expected, in the words of a JSON file.
_EXPECTED = {
    "int_type": "an integer (no quotes, no decimal point)", "float_type": "a number",
    "finite_number": "a finite number (not NaN or Infinity)", "bool_type": "true or false",
    "string_type": "a string", "dict_type": "an object", "dataclass_type": "an object",
    "dataclass_args_type": "an object", "typed_dict_type": "an object",
    "model_type": "an object", "list_type": "a list", "tuple_type": "a list",
    "none_required": "null", "string_too_short": "a non-empty string",
    "int_from_float": "an integer", "literal_error": "{expected}", "enum": "one of {expected}",
    "greater_than": "a value > {gt}", "greater_than_equal": "a value >= {ge}",
    "less_than": "a value < {lt}", "less_than_equal": "a value <= {le}",
    "string_too_long": "at most {max_length} characters",
    "too_long": "at most {max_length} items", "too_short": "at least {min_length} items",
}
_UNKNOWN = ("unexpected_keyword_argument", "extra_forbidden")
_MISSING = ("missing", "missing_argument", "missing_keyword_only_argument")


def json_kind(value: Any) -> str:
    """What a JSON reader would call ``value``."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    for kinds, word in ((int, "an integer"), (float, "a number"), (str, "a string"),
                        ((list, tuple), "a list"), (dict, "an object")):
        if isinstance(value, kinds):
            return word
    return f"a {type(value).__name__}"


def ir_error(err: ValidationError, names: tuple[str, ...], what: str,
             cls: type[MegakernelError] = IRError) -> MegakernelError:
    """One error for all problems of ``err``; ``names`` maps positional
    arguments (their loc is an index) to field names."""
    unknown: dict[str, list[str]] = {}
    missing: dict[str, list[str]] = {}
    problems: list[tuple[str, str, str]] = []      # (path, message, hint)
    for e in err.errors(include_url=False):
        loc = list(e["loc"])
        if loc and isinstance(loc[0], int) and loc[0] < len(names):
            loc[0] = names[loc[0]]
        path = ".".join(str(p) for p in loc)
        parent, _, leaf = path.rpartition(".")
        if e["type"] in _UNKNOWN:
            unknown.setdefault(parent, []).append(leaf)
        elif e["type"] in _MISSING:
            missing.setdefault(parent, []).append(leaf)
        else:
            problems.append(_problem(e, path))
    for parent, keys in unknown.items():
        guesses = _guesses(keys, (*names, *missing.get(parent, ())) if not parent else
                           missing.get(parent, ()))
        text = f"unknown fields {sorted(keys)}" + (f" (did you mean {guesses}?)" if guesses
                                                  else _known(names, parent, what))
        problems.insert(0, (parent, text, "remove them or correct their spelling"))
    for parent, keys in missing.items():
        problems.insert(0, (parent, f"missing required fields {sorted(keys)}",
                            "add them (docs/ir.md lists every field)"))
    if len(problems) == 1:
        path, message, hint = problems[0]
        nested = _nested(err)
        kind = type(nested) if nested is not None and len(err.errors()) == 1 else cls
        return kind(message, path=path, hint=hint)
    listing = "; ".join(f"{p}: {m}" if p else m for p, m, _ in problems[:6])
    more = f"; and {len(problems) - 6} more" if len(problems) > 6 else ""
    return cls(f"{len(problems)} problems: {listing}{more}", hint="fix each listed field")


def _guesses(keys: list[str], candidates) -> str:
    """'a' for 'b', ... for each unknown key with a close known name; "" unless
    every key has one (then the whole list of known names is the better help)."""
    pairs = [(difflib.get_close_matches(k, list(candidates), n=1), k) for k in sorted(keys)]
    if not pairs or not all(close for close, _ in pairs):
        return ""
    return ", ".join(f"{close[0]!r} for {k!r}" for close, k in pairs)


def _known(names: tuple[str, ...], parent: str, what: str) -> str:
    if parent or not names:
        return ""
    return f" for {what}; known: {sorted(names)}" if what else f"; known: {sorted(names)}"


def _nested(err: ValidationError) -> MegakernelError | None:
    ctx = err.errors(include_url=False)[0].get("ctx") or {}
    found = ctx.get("error")
    return found if isinstance(found, MegakernelError) else None


def _problem(e: dict, path: str) -> tuple[str, str, str]:
    ctx = e.get("ctx") or {}
    inner = ctx.get("error")
    if isinstance(inner, MegakernelError):
        # A check in __post_init__: its own path continues the field's.
        full = ".".join(p for p in (path, inner.path) if p)
        return full, inner.message, inner.hint
    value = e.get("input")
    if e["type"] == "value_error":
        expected = str(inner) if inner is not None else e["msg"]
    else:
        template = _EXPECTED.get(e["type"])
        expected = template.format(**ctx) if template else e["msg"]
    found = f"{shown(value)} ({json_kind(value)})"
    leaf = str(e["loc"][-1]) if e["loc"] and isinstance(e["loc"][-1], str) else "it"
    return path, f"expected {expected}, found {found}", f"set {leaf} to {expected}"
