"""The compiled folder is the artifact: what ``compile`` writes, and how ``check``
and ``aot`` trust it again.

``write`` fills a folder with kernel.py, plan.json, plan.md, model.json and
request.json, then manifest.json: the format tag, the megakernel version, and
the sha256 of every file it wrote. ``previous_files`` recognises such a folder
so ``compile`` may replace it (see ``outdir``). ``open_compiled`` checks the
manifest, the version and the digests of the files that run or re-derive the
plan (``VERIFIED``; plan.md is a report for people), reads (model, plan) back
from plan.json (``Plan.from_json``; model.json and request.json must agree). A
changed file is refused by name unless the caller trusts edits on purpose
(``--trust-edited``), and then it is exactly the edited file that runs.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from megakernel.errors import MegakernelError, error_context
from megakernel.cli.outdir import OutputError

FORMAT = "megakernel.compiled/1"
MANIFEST = "manifest.json"
FILES = ("kernel.py", "plan.json", "plan.md", "model.json", "request.json")
VERIFIED = ("kernel.py", "plan.json", "model.json", "request.json")
# No file compile writes comes near this (qwen3-30b-a3b's plan.json is well under
# 1 MiB); reading a larger one would only spend memory on a file we refuse anyway.
MAX_FILE_BYTES = 64 * 2**20
_UNPARSED = "(kernel.py does not parse)"
_FIX = "recompile it with `megakernel compile MODEL -o {d}`"


class ArtifactError(MegakernelError):
    """A compiled folder is missing, malformed, or not what compile wrote."""


def is_compiled(path) -> bool:
    """``path`` is a folder that claims to be a compile output (it has a manifest or
    a kernel.py). os.path never raises here, even for a name too long to exist."""
    return os.path.isdir(path) and any(
        os.path.lexists(os.path.join(path, name)) for name in (MANIFEST, "kernel.py"))


def version() -> str:
    from importlib.metadata import PackageNotFoundError, version as dist_version

    try:
        return dist_version("megakernel")
    except PackageNotFoundError:
        return "unknown"


def sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def write(folder: Path, model, plan) -> None:
    """Write the compiled files and, last, their manifest into ``folder``."""
    from megakernel.backends.pallas_tpu.codegen.load import compile_model
    from megakernel.compiler import report
    from megakernel.ir.serialize import model_to_json

    folder = Path(folder)
    compile_model(model, plan, folder)
    texts = {"plan.json": plan.to_json(indent=1), "plan.md": report.markdown(plan),
             "model.json": model_to_json(model), "request.json": request_json(plan)}
    for name, text in texts.items():
        (folder / name).write_bytes(text.encode())
    manifest = {"format": FORMAT, "megakernel": version(), "model": model.name,
                "plan": plan.digest(), "files": {n: sha256(folder / n) for n in FILES}}
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")


def request_json(plan) -> str:
    r = plan.request
    return json.dumps({"devices": r.devices, "batch": r.batch, "tokens": r.tokens,
                       "context": r.context, "steps_per_call": r.steps,
                       "target": plan.target.chip}, indent=1)


def _show(value) -> str:
    """A value from a file, as an error shows it: at most about 40 characters."""
    text = repr(value)
    return text if len(text) <= 40 else text[:40] + "..."


def _read(folder: Path, name: str) -> bytes:
    path = folder / name
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise ArtifactError(f"{name} is missing", path=str(folder),
                            hint=_FIX.format(d=folder)) from None
    if not stat.S_ISREG(st.st_mode):
        raise ArtifactError(f"{name} is not a plain file", path=str(folder),
                            hint=_FIX.format(d=folder))
    if st.st_size > MAX_FILE_BYTES:
        raise ArtifactError(f"{name} has {st.st_size:,} bytes, more than compile ever writes "
                            f"({MAX_FILE_BYTES:,})", path=str(folder), hint=_FIX.format(d=folder))
    return path.read_bytes()


def _json(folder: Path, name: str, data: bytes):
    try:
        return json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as err:
        detail = "nested too deeply" if isinstance(err, RecursionError) else str(err)[:200]
        raise ArtifactError(f"{name} is not valid JSON: {detail}", path=str(folder),
                            hint=_FIX.format(d=folder)) from None


def read_manifest(folder: Path) -> dict:
    """The manifest of a compiled folder, checked to be one compile writes."""
    folder = Path(folder)
    if not os.path.lexists(folder / MANIFEST):
        raise ArtifactError(
            "is not a folder written by `megakernel compile` (it has no manifest.json)",
            path=str(folder), hint="give a folder written by `megakernel compile MODEL -o DIR`; "
            "a folder compiled before manifests existed must be compiled again")
    m = _json(folder, MANIFEST, _read(folder, MANIFEST))
    files = m.get("files") if isinstance(m, dict) else None
    problem = None
    if not isinstance(m, dict):
        problem = f"expected a JSON object, found {type(m).__name__}"
    elif m.get("format") != FORMAT:
        problem = f"format={_show(m.get('format'))}, expected {FORMAT!r}"
    elif not isinstance(m.get("megakernel"), str):
        problem = "the megakernel version is missing"
    elif not (isinstance(files, dict) and set(files) <= set(FILES)
              and all(isinstance(d, str) and len(d) == 64 for d in files.values())):
        problem = f"'files' must map names among {list(FILES)} to sha256 digests"
    if problem:
        raise ArtifactError(f"manifest.json is not one compile writes: {problem}",
                            path=str(folder), hint=_FIX.format(d=folder))
    return m


def previous_files(folder: Path) -> list[str]:
    """The names in ``folder`` if compile may replace it: empty, or exactly a
    previous output (its manifest, and only files it lists, none edited).
    Otherwise ``OutputError`` saying what is there; nothing is touched."""
    folder = Path(folder)
    names = sorted(os.listdir(folder))
    if not names:
        return []
    hint = ("move those files away or give -o another folder; compile only replaces "
            "a folder it wrote itself")
    shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
    if MANIFEST not in names:
        raise OutputError(f"{folder} holds {shown}, and no manifest.json: it is not a "
                          "previous compile output", path="-o", hint=hint)
    try:
        listed = read_manifest(folder)["files"]
    except ArtifactError as err:
        raise OutputError(f"{folder} holds {shown}, and its {err.message}", path="-o",
                          hint=hint) from None
    extra = [n for n in names if n != MANIFEST and n not in listed]
    if extra:
        raise OutputError(f"{folder} holds {', '.join(extra[:5])}, which its manifest.json "
                          "does not list, so compile did not write it", path="-o", hint=hint)
    for name in names:
        if name == MANIFEST:
            continue
        path = folder / name
        if not stat.S_ISREG(os.lstat(path).st_mode) or sha256(path) != listed[name]:
            raise OutputError(f"{path} was changed after compile wrote it; replacing the "
                              "folder would lose that edit", path="-o",
                              hint="move the edited file or the folder away, or give -o "
                                   "another folder")
    return names


@dataclass(frozen=True)
class Compiled:
    """A verified compiled folder: its model and plan, and its kernel.py."""

    folder: Path
    model: object
    plan: object
    edited: tuple[str, ...] = ()     # files that differ from the manifest (trust_edited)

    @property
    def kernel(self) -> Path:
        return self.folder / "kernel.py"

    def import_kernel(self):
        """Import this folder's kernel.py (the file itself, edited or not)."""
        from megakernel.backends.pallas_tpu.codegen import load

        return load.import_module(self.kernel)


def open_compiled(folder, *, trust_edited: bool = False) -> Compiled:
    """Verify ``folder`` (see the module docstring) and read its (model, plan)
    back from plan.json: the plan the kernel was generated from, not a new one."""
    from megakernel.compiler.plan import Plan
    from megakernel.ir.serialize import model_from_json

    d = Path(folder)
    if not os.path.isdir(d):
        raise ArtifactError("is not a folder", path=str(d),
                            hint="give a folder written by `megakernel compile MODEL -o DIR`")
    manifest = read_manifest(d)
    if manifest["megakernel"] != version():
        raise ArtifactError(f"was compiled by megakernel {_show(manifest['megakernel'])}; "
                            f"this is megakernel {version()}", path=str(d), hint=_FIX.format(d=d))
    data = {name: _read(d, name) for name in VERIFIED}
    recorded = manifest["files"]
    edited = tuple(n for n in VERIFIED if hashlib.sha256(data[n]).hexdigest() != recorded.get(n))
    if edited and not trust_edited:
        them = "it" if len(edited) == 1 else "them"
        raise ArtifactError(
            f"{', '.join(edited)} changed since compile wrote {them} (sha256 differs from "
            "manifest.json)", path=str(d),
            hint=f"{_FIX.format(d=d)}, or pass --trust-edited to use the files as they are now")
    request = _request(d, _json(d, "request.json", data["request.json"]))
    try:
        text = data["model.json"].decode("utf-8")
        with error_context(f"{d}/model.json"):
            model = model_from_json(text)
    except MegakernelError:
        raise
    except (UnicodeDecodeError, ValueError, TypeError, KeyError, AttributeError,
            RecursionError) as err:
        raise ArtifactError(f"model.json is not a model: {type(err).__name__}: {str(err)[:200]}",
                            path=str(d), hint=_FIX.format(d=d)) from None
    saved = _json(d, "plan.json", data["plan.json"])
    try:
        plan = Plan.from_dict(saved)
    except MegakernelError as err:
        raise ArtifactError(f"plan.json does not hold a plan: {err}", path=str(d),
                            hint=_FIX.format(d=d)) from err
    r = plan.request
    agrees = (plan.model == model and
              (r.devices, r.batch, r.tokens, r.context, r.steps, plan.target.chip) == tuple(
                  request[k] for k in ("devices", "batch", "tokens", "context", "steps_per_call",
                                       "target")))
    if not agrees:
        raise ArtifactError("model.json or request.json disagrees with plan.json", path=str(d),
                            hint=_FIX.format(d=d))
    _check_ties(d, manifest, plan, data["kernel.py"])
    return Compiled(d, model, plan, edited)


def _check_ties(folder: Path, manifest: dict, plan, kernel: bytes) -> None:
    """The manifest's model and plan fields and the kernel's own PLAN_DIGEST all
    name plan.json's plan. The kernel is read as text (``kernel_digest``), never
    imported: a kernel.py from another compile is refused before it runs."""
    digest = plan.digest()
    for field, want in (("model", plan.model.name), ("plan", digest)):
        if manifest.get(field) != want:
            raise ArtifactError(f"manifest.json: {field}={_show(manifest.get(field))}, but "
                                f"plan.json is of {field} {want!r}", path=str(folder),
                                hint=_FIX.format(d=folder))
    found = kernel_digest(kernel)
    # A kernel.py that does not parse is left to the import, which names the line.
    if found is not _UNPARSED and found != digest:
        raise ArtifactError(f"kernel.py was generated for plan {_show(found)}, not for "
                            f"plan.json's plan {digest!r}: it comes from another compile",
                            path=str(folder), hint=_FIX.format(d=folder))


def kernel_digest(source: bytes) -> str | None:
    """The ``PLAN_DIGEST = "..."`` string a generated kernel.py assigns at top
    level, read with ``ast`` (nothing in the file runs); None without one,
    ``_UNPARSED`` when the file is not Python."""
    import ast

    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return _UNPARSED
    for stmt in tree.body:
        if (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1
                and isinstance(stmt.targets[0], ast.Name) and stmt.targets[0].id == "PLAN_DIGEST"
                and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str)):
            return stmt.value.value
    return None


def _request(folder: Path, req) -> dict:
    """request.json as plan_model's keyword arguments, each field checked."""
    fields = {"devices": 1, "batch": 1, "tokens": 1, "context": 0,   # name -> least value
              "steps_per_call": 1}
    if isinstance(req, dict) and "steps_per_call" not in req:   # written before issue 14
        req = {**req, "steps_per_call": 1}
    if not isinstance(req, dict) or set(req) != {*fields, "target"}:
        found = sorted(req) if isinstance(req, dict) else type(req).__name__
        raise ArtifactError(f"request.json must be an object with the fields "
                            f"{sorted({*fields, 'target'})}, found {str(found)[:200]}",
                            path=str(folder), hint=_FIX.format(d=folder))
    for name, least in fields.items():
        value = req[name]
        if type(value) is not int or value < least:
            raise ArtifactError(f"request.json: {name}={_show(value)} must be an integer "
                                f">= {least}", path=str(folder), hint=_FIX.format(d=folder))
    if not isinstance(req["target"], str):
        raise ArtifactError(f"request.json: target={_show(req['target'])} must be a chip "
                            "name", path=str(folder), hint=_FIX.format(d=folder))
    return {name: req[name] for name in (*fields, "target")}
