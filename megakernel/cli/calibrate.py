"""``megakernel calibrate``: measure the cost model's compute rates with libtpu.

AOT-compiles the micro-kernels of ``backends/pallas_tpu/aot/calibration_kernels.py``
for one TPU7x TensorCore, reads libtpu's static schedule of each and writes the
generated table (``compiler/calibration.json`` by default) that the cost model
and the core floor read. About a minute on a 2-core machine.
"""

from __future__ import annotations


def cmd_calibrate(args) -> int:
    from megakernel.cli import args as cli_args
    from megakernel.backends.pallas_tpu.aot.calibrate import calibrate
    from megakernel.compiler import calibration

    out = args.output or str(calibration.TABLE)
    command = "megakernel calibrate" + (f" --output {args.output}" if args.output else "")
    if args.only:
        command += " --only " + " ".join(args.only)
    with cli_args.progress("compiling the calibration micro-kernels with libtpu"):
        table = calibrate(out, command=command, only=args.only)
    for name, r in sorted(table["rates"].items()):
        print(f"{name:42s} {r['value']:>14.6g} {r['unit']}")
    print(f"wrote {out} (libtpu {table['libtpu']})")
    return 0


def _calibrate_args(p) -> None:
    p.add_argument("--output", "-o", default=None,
                   help="where to write the table (default: the table the compiler reads)")
    p.add_argument("--only", nargs="+", default=None, metavar="KERNEL",
                   help="re-measure only these micro-kernels (e.g. matmul.q.int8.kn "
                        "matmul.q.int8_dequant.kn), keeping the table's other measurements "
                        "(same libtpu and jax)")
