"""The CLI as the tests call it in-process."""

from megakernel.cli import main


def run(*argv, capsys):
    """``megakernel *argv`` in this process: (exit code, stdout, stderr)."""
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err
