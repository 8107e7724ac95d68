"""A compile killed with SIGKILL leaves its `.NAME.partial-XXXXXXXX` folder; the
next compile to the same output removes it, and never a live compile's (issue 33)."""

import os
import subprocess
import sys
import time

from megakernel.cli import artifact, outdir, partials
from megakernel.cli import main

OLD = time.time() - 10 * partials.GRACE_S


def partial(parent, name, *, age=OLD):
    path = parent / f".{name}.partial-{os.urandom(4).hex()}"
    path.mkdir()
    (path / "kernel.py").write_text("# half written")
    os.utime(path, (age, age))
    return path


def fill(out):
    with outdir.staged(str(out), artifact.previous_files) as tmp:
        (tmp / "kernel.py").write_text("x = 1\n")


def test_a_dead_compiles_partial_folder_is_removed_and_live_ones_kept(tmp_path, capsys):
    out = tmp_path / "tiny"
    dead = partial(tmp_path, "tiny")
    live = partial(tmp_path, "tiny")
    fresh = partial(tmp_path, "tiny", age=time.time())   # made, maybe not yet locked
    other = partial(tmp_path, "other")                     # another output's
    held = partials.lock(live)                             # as a running compile holds it
    try:
        fill(out)
    finally:
        os.close(held)
    assert not dead.exists()
    assert live.exists() and fresh.exists() and other.exists()
    assert (out / "kernel.py").read_text() == "x = 1\n"
    assert f"removed {dead}" in capsys.readouterr().err


def test_a_compile_killed_with_sigkill_is_cleaned_by_the_next(tmp_path):
    out = tmp_path / "tiny"
    code = ("import os, sys\nfrom megakernel.cli import artifact, outdir\n"
            "with outdir.staged(sys.argv[1], artifact.previous_files) as tmp:\n"
            "    (tmp / 'kernel.py').write_text('half')\n"
            "    os.kill(os.getpid(), 9)\n")
    done = subprocess.run([sys.executable, "-c", code, str(out)], timeout=60)
    assert done.returncode == -9
    [left] = [p for p in tmp_path.iterdir() if ".partial-" in p.name]
    os.utime(left, (OLD, OLD))
    fill(out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny"]


def test_an_output_inside_a_file_names_the_users_path(tmp_path, capsys):
    (tmp_path / "notes").write_text("mine")
    out = tmp_path / "notes" / "sub"
    assert main(["compile", "tiny-dense", "-o", str(out)]) == 2
    err = " ".join(capsys.readouterr().err.split())
    # (the printer may break the long tmp path at a hyphen: match its end)
    assert "/notes/sub: refusing" in err and "/notes is a file, not a folder" in err, err
    assert ".partial-" not in err and (tmp_path / "notes").read_text() == "mine"
