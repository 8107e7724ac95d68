"""Which modules an entry of a ``quantization_config``'s ``targets`` or
``ignore`` names.

An entry is ``Linear`` (every matrix), ``re:PATTERN`` (PATTERN matched from
the start of the module name, as compressed-tensors' ``re.match`` does), or an
exact module name. The patterns come from a model file, and Python's ``re``
backtracks: ``re:(.*)*x`` against a 30-character module name never returns. So
they run on RE2 (google-re2), whose matching time is linear in the name's
length whatever the pattern. RE2 reads Python's syntax but for lookaround
(``(?=``, ``(?!``, ``(?<=``), backreferences, atomic groups and possessive
repeats, and repeat counts over 1000; a
pattern that uses them or does not parse is refused up front, naming the field,
its index and the pattern (``pattern_problems``), before any module is matched.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import re2

from megakernel.errors import shown

# RE2 compiles a pattern into at most this much memory (its default, 8 MiB): a
# pattern beyond it is refused like a malformed one.
_MAX_MEM = 8 << 20


def _options() -> re2.Options:
    options = re2.Options()
    options.log_errors = False      # errors reach the user as ours, not on stderr
    options.max_mem = _MAX_MEM
    return options


@functools.lru_cache(maxsize=4096)
def _compiled(pattern: str) -> Any:
    return re2.compile(pattern, _options())


def pattern_problems(entries: list[str], where: str) -> list[str]:
    """One ``where[i]: ...`` problem per ``re:`` entry RE2 cannot read."""
    problems = []
    for i, entry in enumerate(entries):
        if not entry.startswith("re:"):
            continue
        try:
            _compiled(entry[3:])
        except (re2.error, UnicodeEncodeError) as err:
            reason = err.args[0].decode() if isinstance(err, re2.error) and err.args and \
                isinstance(err.args[0], bytes) else str(err)
            problems.append(f"{where}[{i}]: {shown(entry)} is not a regular expression this "
                            f"loader reads ({shown(reason)}); patterns run on RE2, which has "
                            "no lookaround, backreferences, atomic groups or possessive "
                            "repeats: rewrite it without them")
    return problems


@dataclass(frozen=True)
class Boundary:
    """An entry of gpt-oss's ``modules_to_not_convert``, read as transformers'
    ``should_convert_module`` does: ``key``, a regular expression, matches the
    module name from its start up to a module boundary (the end, or just
    before or after a ``.``), or the name ends with ``key`` as text. Python
    writes the boundary as lookaround, which RE2 lacks; here each boundary
    of the name is tried as the end of a full match (a name has few)."""

    key: str

    def names(self, module: str) -> bool:
        if module.endswith(self.key):
            return True
        pattern = _compiled(self.key)
        ends = {len(module)} | {i + d for i, c in enumerate(module) if c == "." for d in (0, 1)}
        return any(pattern.fullmatch(module[:end]) is not None for end in sorted(ends))


def matches(target: str | Boundary, module: str) -> bool:
    """Whether entry ``target`` names HF module ``module``."""
    if isinstance(target, Boundary):
        return target.names(module)
    if target == "Linear":
        return True
    if target.startswith("re:"):
        return _compiled(target[3:]).match(module) is not None
    return target == module


def module_or_parent(name: str) -> str:
    """The ``re:`` entry for a name of DeepSeek's ``modules_to_not_convert``: the
    module itself, any module ending in it, or a parent of modules."""
    return f"re:(?:.*\\.)?{re2.escape(name)}(?:\\..*)?$"
