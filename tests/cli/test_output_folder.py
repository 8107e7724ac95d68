"""`compile -o DIR` never removes anything it did not write (issue 9).

Every test compiles into tmp_path, or runs with tmp_path as the working
directory and home, so a regression could only ever touch pytest's own folders.
"""

import json
import os
from pathlib import Path

import pytest

from megakernel.cli import artifact
from megakernel.cli import outdir
from megakernel.cli import main


def compile_to(out, *extra, capsys=None):
    code = main(["compile", "tiny-dense", "-o", str(out), *extra])
    err = capsys.readouterr().err if capsys else ""
    return code, " ".join(err.split())   # the printer wraps lines at 88 columns


def snapshot(folder: Path) -> dict:
    """Every path under ``folder`` with its bytes (folders as None)."""
    return {str(p.relative_to(folder)): (p.read_bytes() if p.is_file() else None)
            for p in sorted(folder.rglob("*"))}


def siblings(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


@pytest.fixture
def user_dir(tmp_path, monkeypatch):
    """tmp_path/work as the working directory and tmp_path/home as home, both
    holding files of the user's."""
    work, home = tmp_path / "work", tmp_path / "home"
    (work / "src").mkdir(parents=True)
    (work / "notes.txt").write_text("mine")
    (work / "src" / "model.py").write_text("print('mine')")
    home.mkdir()
    (home / ".bashrc").write_text("mine")
    monkeypatch.chdir(work)
    monkeypatch.setenv("HOME", str(home))
    return tmp_path


def test_compile_writes_a_manifest_of_every_file(tmp_path):
    out = tmp_path / "k"
    assert main(["compile", "tiny-dense", "-o", str(out)]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["format"] == artifact.FORMAT
    assert manifest["megakernel"] == artifact.version()
    assert set(manifest["files"]) == set(artifact.FILES)
    for name, digest in manifest["files"].items():
        assert artifact.sha256(out / name) == digest, name
    assert sorted(p.name for p in out.iterdir()) == sorted([*artifact.FILES, "manifest.json"])
    assert siblings(tmp_path) == []
    # The folder gets the user's usual permissions, not a private temp folder's.
    assert out.stat().st_mode & 0o777 == 0o777 & ~_umask()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@pytest.mark.parametrize("where, needle", [
    (".", "is the working directory"), ("", "is the working directory"),
    ("./", "is the working directory"), ("src/..", "is the working directory"),
    ("..", "contains the working directory"), ("../..", "contains the working directory"),
    ("../home", "is your home folder"), ("/", "is the root folder"),
])
def test_refuses_the_working_directory_its_parents_home_and_root(where, needle, user_dir,
                                                                 capsys):
    before = snapshot(user_dir)
    code, err = compile_to(where, capsys=capsys)
    assert code == 2
    assert needle in err and "nothing was written or deleted" in err, err
    assert "Traceback" not in err
    assert snapshot(user_dir) == before


def test_refuses_a_folder_of_other_files_and_deletes_nothing(tmp_path, capsys):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "data.csv").write_text("1,2")
    (out / "kernel.py").write_text("# my own kernel.py, not compile's")
    before = snapshot(tmp_path)
    code, err = compile_to(out, capsys=capsys)
    assert code == 2
    assert str(out) in err and "no manifest.json" in err and "data.csv" in err
    assert snapshot(tmp_path) == before


def test_refuses_a_file(tmp_path, capsys):
    path = tmp_path / "notes"
    path.write_text("mine")
    code, err = compile_to(path, capsys=capsys)
    assert code == 2 and "is a file" in err
    assert path.read_text() == "mine" and siblings(tmp_path) == []


def test_refuses_a_symlink(tmp_path, capsys):
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "keep").write_text("mine")
    (tmp_path / "link").symlink_to(tmp_path / "real")
    code, err = compile_to(tmp_path / "link", capsys=capsys)
    assert code == 2 and "symbolic link" in err
    assert (tmp_path / "real" / "keep").read_text() == "mine"


def test_an_empty_folder_is_filled(tmp_path):
    (tmp_path / "k").mkdir()
    assert compile_to(tmp_path / "k")[0] == 0
    assert (tmp_path / "k" / "manifest.json").is_file()


def test_replaces_its_own_previous_output(tmp_path, capsys):
    out = tmp_path / "k"
    assert compile_to(out)[0] == 0
    assert compile_to(out, "--batch", "2", capsys=capsys)[0] == 0
    assert json.loads((out / "request.json").read_text())["batch"] == 2
    assert siblings(tmp_path) == []


@pytest.mark.parametrize("change, needle", [
    (lambda d: (d / "notes.txt").write_text("mine"), "notes.txt"),
    (lambda d: (d / "sub").mkdir(), "sub"),
    (lambda d: (d / "kernel.py").write_text("# edited by hand"), "was changed"),
    (lambda d: (d / "manifest.json").write_text("{"), "not valid JSON"),
    (lambda d: (d / "manifest.json").write_text(json.dumps(
        {"format": artifact.FORMAT, "megakernel": "0", "files": {"../../x": "0" * 64}})),
     "not one compile writes"),
])
def test_refuses_a_previous_output_holding_anything_else(change, needle, tmp_path, capsys):
    out = tmp_path / "k"
    assert compile_to(out)[0] == 0
    change(out)
    before = snapshot(tmp_path)
    code, err = compile_to(out, "--batch", "2", capsys=capsys)
    assert code == 2 and needle in err, err
    assert snapshot(tmp_path) == before


def test_a_failed_compile_keeps_the_previous_output(tmp_path, capsys):
    out = tmp_path / "k"
    assert compile_to(out)[0] == 0
    before = snapshot(tmp_path)
    code, err = compile_to(out, "--devices", "3", capsys=capsys)   # tiny-dense: 4 heads
    assert code == 2 and "cannot be split evenly over 3" in err
    assert snapshot(tmp_path) == before


def test_a_failure_while_writing_removes_the_partial_folder(tmp_path, monkeypatch):
    def half_write(folder, model, plan):
        (Path(folder) / "kernel.py").write_text("half")
        raise OSError(28, "No space left on device")

    assert compile_to(tmp_path / "old")[0] == 0
    before = snapshot(tmp_path)
    monkeypatch.setattr(artifact, "write", half_write)
    assert compile_to(tmp_path / "old")[0] == 2
    assert compile_to(tmp_path / "new" / "deeper" / "k")[0] == 2
    assert snapshot(tmp_path) == before   # no .partial sibling, no new parent folders


def test_a_failed_rename_puts_the_previous_output_back(tmp_path, monkeypatch):
    out = tmp_path / "k"
    assert compile_to(out)[0] == 0
    before = snapshot(tmp_path)
    rename = os.rename

    def failing(src, dst):
        # Fail the one rename that moves the new output in, after the previous
        # output was moved aside: the previous one must come back.
        if ".partial-" in str(src) and not os.path.lexists(dst):
            raise OSError(5, "Input/output error")
        rename(src, dst)

    monkeypatch.setattr(outdir.os, "rename", failing)
    assert compile_to(out, "--batch", "2")[0] == 2
    assert snapshot(tmp_path) == before


def test_a_path_component_too_long_is_a_named_error(tmp_path, capsys):
    code, err = compile_to(tmp_path / ("x" * 300) / "k", capsys=capsys)
    assert code == 2 and "300 characters long" in err and "Traceback" not in err
    # A name that fits, but not with the temporary sibling's suffix added.
    code, err = compile_to(tmp_path / ("y" * 250), capsys=capsys)
    assert code == 2 and "at most 236 bytes" in err
    assert list(tmp_path.iterdir()) == []
