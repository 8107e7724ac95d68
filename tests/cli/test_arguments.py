"""Bad command-line arguments are named errors, exit 2, no traceback, and any
error prints in bounded time (issue 9)."""

import contextlib
import re
import time

import pytest

from megakernel import cli
from megakernel.cli import main
from megakernel.errors import MegakernelError


def run(argv, capsys):
    """(exit code, stderr with its line wrapping undone)."""
    try:
        code = main(argv)
    except SystemExit as exit_:   # argparse's own errors
        code = exit_.code
    return code, " ".join(capsys.readouterr().err.split())


@pytest.mark.parametrize("argv, needle", [
    (["check", "tiny-dense", "--steps", "0"], "argument --steps: 0 is out of range"),
    (["check", "tiny-dense", "--steps", "-1"], "argument --steps: -1 is out of range"),
    (["check", "tiny-dense", "--seed", "-1"], "argument --seed: -1 is out of range"),
    (["check", "tiny-dense", "--seed", "1" * 5000], "argument --seed: '111"),
    (["check", "tiny-dense", "--examples", "-1"], "argument --examples: -1 is out of range"),
    (["check", "tiny-dense", "--max-weights-gib", "nan"], "not a positive, finite number"),
    (["plan", "tiny-dense", "--devices", "0"], "argument --devices/-n: 0 is out of range"),
    (["plan", "tiny-dense", "--devices", "-1"], "argument --devices/-n: -1 is out of range"),
    (["plan", "tiny-dense", "--devices", "33"], "give an integer in 1..32"),
    (["plan", "tiny-dense", "--devices", "two"], "'two' is not an integer"),
    (["plan", "tiny-dense", "--batch", "0"], "argument --batch/-b: 0 is out of range"),
    (["plan", "tiny-dense", "--tokens", "0"], "argument --tokens/-t: 0 is out of range"),
    (["plan", "tiny-dense", "--layers", "0"], "argument --layers: 0 is out of range"),
    (["plan", "tiny-dense", "--layers", "3"], "--layers: 3 is more than the 2 layers"),
    (["check", "tiny-dense", "--layers", "3", "--examples", "1"], "3 is more than the 2"),
    (["plan", "tiny-dense", "--context", "0"], "argument --context: 0 is out of range"),
    (["plan", "tiny-dense", "--context=-4"], "argument --context: -4 is out of range"),
    (["plan", "tiny-dense", "--vmem-budget", "infMiB"], "'infMiB' is not a size"),
    (["plan", "tiny-dense", "--vmem-budget", "nanMiB"], "'nanMiB' is not a size"),
    (["plan", "tiny-dense", "--vmem-budget=-5MiB"], "'-5MiB' is not a size"),
    (["plan", "tiny-dense", "--vmem-budget", "1e400MiB"], "'1e400MiB' is not a size"),
    (["plan", "tiny-dense", "--vmem-budget", "0MiB"], "give a whole number of bytes, at least 1"),
    (["plan", "tiny-dense", "--vmem-budget", "0.3KiB"], "give a whole number of bytes"),
    (["plan", "tiny-dense", "--vmem-budget", "1GiB"], "more than the 64 MiB of VMEM"),
    (["plan", "tiny-dense", "--bank-bytes", "0"], "argument --bank-bytes"),
    (["plan", "tiny-dense", "--banks", "0"], "argument --banks: 0 is out of range"),
    (["plan", "tiny-dense", "--moe-parallel", "0"], "give tp, ep, or an expert-parallel degree"),
    (["aot", "somewhere", "--topology", "tpu9:1x1"],
     "'tpu9:1x1' is not a topology this project compiles for; known: tpu7x:1x1x1"),
    (["compile", "tiny-dense", "-o", "{tmp}/" + "x" * 300 + "/k"], "is 300 characters long"),
    (["check", "y" * 300], "File name too long"),
])
def test_bad_arguments_are_named_errors(argv, needle, tmp_path, capsys):
    t0 = time.perf_counter()
    code, err = run([a.replace("{tmp}", str(tmp_path)) for a in argv], capsys)
    assert code == 2, err
    assert needle in err, err
    assert "Traceback" not in err
    assert time.perf_counter() - t0 < 10


def test_good_sizes_still_parse():
    from megakernel.cli.args import parse_size

    assert parse_size("48MiB") == 48 * 2**20
    assert parse_size("1.5KiB") == 1536
    assert parse_size(" 2gib ") == 2 * 2**30
    assert parse_size("1MB") == 10**6
    assert parse_size("4096") == 4096


@pytest.mark.parametrize("message", ["x" * 20_000_000, "word " * 4_000_000])
def test_a_huge_error_prints_in_bounded_time(message, capsys, monkeypatch):
    def fail(args):
        raise MegakernelError(message, path="config.name")

    monkeypatch.setitem(cli.COMMANDS, "show", (fail, "fails", ["megakernel show x"]))
    t0 = time.perf_counter()
    code, err = run(["show", "x"], capsys)
    assert time.perf_counter() - t0 < 2
    assert code == 2
    assert len(err) < cli.MAX_ERROR_CHARS + 200
    # Cut by the error itself (errors.shown caps every message) or, failing
    # that, by the printer; either way the reader is told how much was cut.
    assert re.search(r"(\d[\d,]* more characters not shown|\(20,000,000 chars\))", err), err[-300:]


def test_ctrl_c_while_parsing_arguments_prints_one_line(capsys, monkeypatch):
    """Ctrl-C before the command starts (here inside an argument's type) is
    the same one line and exit 130 as during a command (issue 33)."""
    from megakernel.cli import args as cli_args

    def interrupted(text):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli_args, "devices", interrupted)
    code, err = run(["plan", "tiny-dense", "--devices", "2"], capsys)
    assert code == 130, err
    assert "interrupted by SIGINT" in err and "Traceback" not in err


def test_a_closed_pipe_ends_quietly(capsys, monkeypatch):
    """`megakernel plan ... | head -1`: the reader left; no error line, exit
    141 as SIGPIPE gives (issue 33: 'error: [Errno 32] Broken pipe', exit 2)."""
    import io
    import os
    import sys

    r, w = os.pipe()
    os.close(r)                        # the reader is gone: writes fail with EPIPE
    pipe = io.TextIOWrapper(io.FileIO(w, "w"))
    monkeypatch.setattr(sys, "stdout", pipe)
    try:
        code, err = run(["plan", "tiny-dense", "--json"], capsys)
    finally:
        monkeypatch.undo()
        with contextlib.suppress(OSError):
            pipe.close()
    assert code == 141, err
    assert "error" not in err and "Traceback" not in err


@pytest.mark.parametrize("argv, needle", [
    (["--steps", "1000000"], "reach position 1000002, past the max_seq_len=512 positions of "
                             "tiny-dense (give --steps at most 509)"),
    (["--batch", "4", "--steps", "600"], "the last of 4 rows starting 3 positions later, "
                                         "reach position 605"),
    (["--batch", "600"], "(give --batch at most 508)"),
])
def test_check_refuses_positions_past_max_seq_len_before_it_starts(argv, needle, capsys,
                                                                   monkeypatch):
    """Issue 33: --steps 1000000 ran unbounded, and steps past max_seq_len were
    reported as a kernel FAIL."""
    from megakernel.backends.pallas_tpu.check import kernel_check

    def started(*a, **k):
        raise AssertionError("the check started")

    monkeypatch.setattr(kernel_check, "check", started)
    code, err = run(["check", "tiny-dense"] + argv, capsys)
    assert code == 2 and needle in err, err
