"""`check DIR` and `aot DIR` run the folder's own kernel.py, after verifying the
manifest's digests and version; `--trust-edited` runs the edited file (issue 9)."""

import json

import pytest

from megakernel.cli import artifact
from megakernel.cli import main
from megakernel.testing import FAULTS


def run(*argv, capsys):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, " ".join(out.err.split())   # the printer wraps lines


@pytest.fixture
def folder(tmp_path):
    out = tmp_path / "tiny-dense"
    assert main(["compile", "tiny-dense", "--layers", "1", "--steps-per-call", "1",
                 "-o", str(out)]) == 0
    return out


def break_kernel(folder):
    """Drop the attention residual: a kernel that imports and runs, but is wrong."""
    _, old, new = FAULTS["skip_attention_residual"]
    text = (folder / "kernel.py").read_text()
    assert old in text
    (folder / "kernel.py").write_text(text.replace(old, new))


@pytest.mark.parametrize("command", ["check", "aot"])
def test_an_edited_kernel_is_refused_by_name(command, folder, capsys):
    break_kernel(folder)
    code, _, err = run(command, str(folder), capsys=capsys)
    assert code == 2
    assert "kernel.py changed since compile wrote it" in err
    assert "--trust-edited" in err and "megakernel compile" in err
    assert "Traceback" not in err


def test_trust_edited_checks_exactly_the_edited_kernel(folder, capsys):
    break_kernel(folder)
    code, out, err = run("check", str(folder), "--steps", "1", "--trust-edited", capsys=capsys)
    assert code == 1 and out.startswith("FAIL"), out
    assert "using kernel.py as edited" in err


@pytest.mark.parametrize("command", ["check", "aot"])
def test_trust_edited_imports_the_folders_own_file(command, folder, capsys):
    # Proves it is DIR/kernel.py that is imported (a regenerated kernel would
    # not raise), without running the interpreter or libtpu.
    with open(folder / "kernel.py", "a") as f:
        f.write("\nraise RuntimeError('the edited kernel.py ran')\n")
    code, _, err = run(command, str(folder), "--trust-edited", capsys=capsys)
    assert code == 2 and "the edited kernel.py ran" in err, err


@pytest.mark.parametrize("name", ["plan.json", "model.json", "request.json", "kernel.py"])
def test_a_missing_file_is_named(name, folder, capsys):
    (folder / name).unlink()
    code, _, err = run("check", str(folder), "--trust-edited", capsys=capsys)
    assert code == 2 and f"{name} is missing" in err, err


@pytest.mark.parametrize("name", ["plan.json", "model.json", "request.json"])
def test_an_edited_plan_model_or_request_is_refused(name, folder, capsys):
    with open(folder / name, "a") as f:
        f.write(" ")
    code, _, err = run("check", str(folder), capsys=capsys)
    assert code == 2 and f"{name} changed since compile wrote it" in err, err


@pytest.mark.parametrize("name, text, needle", [
    ("request.json", '{"devices": 1,', "request.json is not valid JSON"),
    ("request.json", "[1, 2]", "request.json must be an object"),
    ("request.json", json.dumps({"devices": "1", "batch": 1, "tokens": 1, "context": 3,
                                 "target": "tpu7x"}), "devices='1' must be an integer"),
    ("request.json", json.dumps({"devices": 1, "batch": 0, "tokens": 1, "context": 3,
                                 "target": "tpu7x"}), "batch=0 must be an integer >= 1"),
    ("request.json", json.dumps({"devices": 1, "batch": 1, "tokens": 1, "context": 3,
                                 "target": 7}), "target=7 must be a chip name"),
    ("plan.json", "{", "plan.json is not valid JSON"),
    ("plan.json", "[" * 100_000, "plan.json is not valid JSON: nested too deeply"),
    ("plan.json", "{}", "plan.json does not hold a plan"),
    ("plan.json", json.dumps({"format": "megakernel.plan/1", "model": 3}),
     "plan.json does not hold a plan"),
    ("request.json", json.dumps({"devices": 1, "batch": 5, "tokens": 1, "context": 3,
                                 "target": "tpu7x"}), "disagrees with plan.json"),
    ("model.json", "{", "not valid JSON"),
    ("model.json", b"\xff\xfe", "model.json is not a model"),
])
def test_malformed_files_are_named_errors(name, text, needle, folder, capsys):
    data = text if isinstance(text, bytes) else text.encode()
    (folder / name).write_bytes(data)
    code, _, err = run("check", str(folder), "--trust-edited", capsys=capsys)
    assert code == 2 and needle in err, err
    assert "Traceback" not in err


@pytest.mark.parametrize("text, needle", [
    ("{", "manifest.json is not valid JSON"),
    ("[]", "expected a JSON object"),
    ('{"format": "other/1"}', "format='other/1'"),
    (json.dumps({"format": artifact.FORMAT, "megakernel": "0.1.0", "files": {"/etc/passwd": 1}}),
     "'files' must map names"),
])
@pytest.mark.parametrize("command", ["check", "aot"])
def test_a_malformed_manifest_is_a_named_error(command, text, needle, folder, capsys):
    (folder / "manifest.json").write_text(text)
    code, _, err = run(command, str(folder), "--trust-edited", capsys=capsys)
    assert code == 2 and needle in err, err


def test_another_compiler_version_is_refused(folder, capsys):
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["megakernel"] = "0.0.1"
    (folder / "manifest.json").write_text(json.dumps(manifest))
    code, _, err = run("check", str(folder), "--trust-edited", capsys=capsys)
    assert code == 2 and "compiled by megakernel '0.0.1'" in err


@pytest.mark.parametrize("command", ["check", "aot"])
def test_a_folder_that_is_no_compile_output_is_named(command, tmp_path, capsys):
    (tmp_path / "kernel.py").write_text("raise SystemExit('must not run')\n")
    code, _, err = run(command, str(tmp_path), capsys=capsys)
    assert code == 2 and "has no manifest.json" in err, err


@pytest.mark.parametrize("argv, needle", [
    (["check", "{dir}", "--devices", "2"], "--devices does not apply to a compiled folder"),
    (["check", "{dir}", "--layers", "1"], "--layers does not apply to a compiled folder"),
    (["check", "{dir}", "--examples", "2"], "--examples checks a MODEL"),
    (["check", "tiny-dense", "--trust-edited"], "--trust-edited applies to a folder"),
    (["aot", "{dir}/missing"], "is not a folder"),
    (["aot", "{dir}", "--topology", "tpu7x:1x1x1"], "does not fit"),
])
def test_flags_that_do_not_apply_are_named(argv, needle, tmp_path, capsys):
    out = tmp_path / "k"
    assert main(["compile", "tiny-dense", "--devices", "4", "-o", str(out)]) == 0
    code, _, err = run(*[a.format(dir=out) for a in argv], capsys=capsys)
    assert code == 2 and needle in err, err


def test_a_folder_compiled_with_overrides_checks_from_its_own_plan(tmp_path, capsys):
    """check reads the plan back from plan.json (Plan.from_json), so choices
    request.json does not record (here the ring's bank count) survive."""
    out = tmp_path / "banks"
    assert main(["compile", "tiny-dense", "--layers", "1", "--banks", "3",
                 "--steps-per-call", "1", "-o", str(out)]) == 0
    capsys.readouterr()
    code, text, err = run("check", str(out), "--steps", "1", capsys=capsys)
    assert code == 0 and text.startswith("PASS"), err
    assert "NUM_BANKS = 3" in (out / "kernel.py").read_text()


def _set_manifest(folder, **fields):
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest.update(fields)
    (folder / "manifest.json").write_text(json.dumps(manifest))


@pytest.mark.parametrize("field, value", [("model", "qwen3-8b"), ("plan", "0" * 16)])
def test_manifest_model_and_plan_must_name_plan_json(field, value, folder, capsys):
    _set_manifest(folder, **{field: value})
    code, _, err = run("aot", str(folder), capsys=capsys)
    assert code == 2 and f"manifest.json: {field}={value!r}" in err, err


@pytest.mark.parametrize("command", ["check", "aot"])
def test_a_kernel_from_another_compile_is_refused_before_it_runs(command, folder, tmp_path,
                                                                   capsys):
    """kernel.py of another plan (batch 2), with the manifest's digest recomputed
    so it looks unedited: its PLAN_DIGEST is read as text and refused; the
    appended raise proves nothing in it ran."""
    other = tmp_path / "batch2"
    assert main(["compile", "tiny-dense", "--layers", "1", "--batch", "2",
                 "--steps-per-call", "1", "-o", str(other)]) == 0
    capsys.readouterr()
    text = (other / "kernel.py").read_text() + "\nraise RuntimeError('the foreign kernel ran')\n"
    (folder / "kernel.py").write_text(text)
    files = json.loads((folder / "manifest.json").read_text())["files"]
    _set_manifest(folder, files={**files, "kernel.py": artifact.sha256(folder / "kernel.py")})
    code, _, err = run(command, str(folder), capsys=capsys)
    assert code == 2, err
    assert "kernel.py was generated for plan" in err and "another compile" in err, err
    assert "foreign kernel ran" not in err


def test_the_kernel_digest_is_read_without_running_the_file():
    source = b"import os\nos.system('false')\nPLAN_DIGEST = \"abc\"\n"
    assert artifact.kernel_digest(source) == "abc"
    assert artifact.kernel_digest(b"X = 1\n") is None
