"""Load: write the generated module to DIR/kernel.py, check it, import it.

Errors raised while the module is parsed, imported or traced are turned into
``EmitError`` naming the generated file and line and the IR node whose
``# node:`` comment precedes that line.
"""

from __future__ import annotations

import ast
import importlib.util
import itertools
import sys
import traceback
from pathlib import Path

from megakernel.errors import EmitError
from megakernel.backends.pallas_tpu.codegen import emit

_counter = itertools.count()


def write(source: str, out_dir) -> Path:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "kernel.py"
    path.write_text(source)
    return path


def check_syntax(path: Path) -> None:
    try:
        ast.parse(path.read_text(), filename=str(path))
    except SyntaxError as err:
        raise EmitError(f"generated source does not parse: {err.msg}",
                        path=f"{path}:{err.lineno}") from err


def import_module(path) -> object:
    path = Path(path)
    check_syntax(path)
    name = f"megakernel_generated_{next(_counter)}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as err:  # noqa: BLE001 - re-raised with the location
        raise located(err, path, "import") from err
    module.__file__ = str(path)
    return module


def node_at(path: Path, line: int) -> str:
    """The IR node of the nearest ``# node:`` comment above ``line``."""
    lines = Path(path).read_text().splitlines()[:line]
    for text in reversed(lines):
        text = text.strip()
        if text.startswith("# node:"):
            return text[len("# node:"):].strip()
    return "module"


def located(err: BaseException, path, stage: str) -> EmitError:
    """EmitError pointing at the deepest frame of ``err`` in the generated file."""
    path = Path(path)
    frames = [f for f in traceback.extract_tb(err.__traceback__)
              if Path(f.filename).resolve() == path.resolve()]
    if not frames:
        return EmitError(f"{stage} failed: {type(err).__name__}: {str(err)[:2000]}",
                         path=str(path))
    line = frames[-1].lineno
    return EmitError(f"{stage} failed at {path}:{line} ({node_at(path, line)}): "
                     f"{type(err).__name__}: {str(err)[:2000]}", path=node_at(path, line))


def load(source: str, out_dir):
    """write + check + import; returns the module."""
    return import_module(write(source, out_dir))


def compile_model(model, plan, out_dir, *, synchronised: bool = False) -> Path:
    """Write ``out_dir/kernel.py`` for ``plan`` (checked with ``ast``); returns its
    path. ``synchronised``: the synchronised-ops ablation of the same plan."""
    path = write(emit.render(model, plan, synchronised=synchronised), out_dir)
    check_syntax(path)
    return path
