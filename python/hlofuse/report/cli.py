"""hlofuse-report: predicted time per call of a StableHLO program on each target, where it goes, and what to fix.

Reads anything hlofuse-opt reads (hlofuse.ir.loader: StableHLO text or bytecode, jax.export artifacts, XLA
HLO dumps), runs hlofuse's default pipeline for each target as that target sees it, and models the result
(hlofuse.report.model). Errors print one line and exit 1, as hlofuse-opt does.
"""

from __future__ import annotations

import argparse
import sys
import traceback
import typing
from collections.abc import Sequence
from pathlib import Path

PROG = "hlofuse-report"

EPILOG = """\
examples:
  hlofuse-report model.mlir                         # every chip in the table
  hlofuse-report prefill.mlir --targets host,tpu-v5e,h100 --json out.json --html out.html
  hlofuse-report decode_gqa8.mlir --compare decode_gqa2.mlir --targets tpu-v6e,h200
  hlofuse-report step.mlir --targets host --measure  # also run it on this CPU

targets: host (this machine, calibrated once and cached in ~/.cache/hlofuse), tpu-v5e, tpu-v5p, tpu-v6e, tpu-v7,
h100, h200, b200, trn1, trn2 (python/hlofuse/report/chips.toml has every number and its source). Host
predictions are validated against measurements (docs/report.md); the others are not.
"""


class UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> typing.NoReturn:
        raise UsageError(message)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description="Analytical performance model of a StableHLO program per target.",
                     epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False)
    parser.add_argument("input", help="the program ('-' for stdin): any format hlofuse-opt reads")
    parser.add_argument("--targets", default="all", metavar="LIST",
                        help="comma-separated targets (default: all)")
    parser.add_argument("--json", metavar="FILE", help="write the report as JSON ('-' for stdout)")
    parser.add_argument("--html", metavar="FILE", help="write a self-contained HTML page")
    parser.add_argument("--compare", metavar="OTHER_INPUT", help="a second program, side by side per target")
    parser.add_argument("--measure", action="store_true", help="run the program on this CPU and time it")
    parser.add_argument("--runs", type=int, default=5, help="timed calls for --measure (default: 5)")
    parser.add_argument("--no-fuse", dest="fuse", action="store_false",
                        help="model the program as XLA runs it without hlofuse")
    parser.add_argument("--kv-fill", type=float, default=1.0, metavar="F",
                        help="fraction of the KV cache attention sites with kv_lengths read (default: 1)")
    parser.add_argument("--top", type=int, default=8, help="regions shown per target (default: 8)")
    parser.add_argument("--no-calibrate", dest="calibrate", action="store_false",
                        help="use the table's host fallbacks instead of measuring this machine")
    parser.add_argument("--recalibrate", action="store_true", help="measure this machine again")
    parser.add_argument("--quiet", action="store_true", help="no terminal table (with --json/--html)")
    parser.add_argument("--debug", action="store_true", help="show Python tracebacks")
    return parser


def _load(path: str):  # noqa: ANN202
    from hlofuse.ir import loader

    return loader.load_file(path)


def _write(path: str, text: str) -> None:
    if path == "-":
        sys.stdout.write(text)
        return
    target = Path(path)
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(target)


def run(argv: Sequence[str]) -> int:
    args = build_parser().parse_args(argv)
    if not 0 < args.kv_fill <= 1:
        raise UsageError("--kv-fill must be in (0, 1]")
    if args.runs < 1:
        raise UsageError("--runs must be at least 1")
    from hlofuse.report import hardware, render
    from hlofuse.report.model import analyze

    targets = hardware.resolve_targets(args.targets)
    if args.recalibrate and "host" in targets:
        hardware.host_calibration(refresh=True, verbose=True)
    loaded = _load(args.input)
    report = analyze(loaded.module, targets, fuse=args.fuse, kv_fill=args.kv_fill, calibrate=args.calibrate,
                     program=loaded.name, verbose=True)
    other = None
    if args.compare:
        second = _load(args.compare)
        other = analyze(second.module, targets, fuse=args.fuse, kv_fill=args.kv_fill, calibrate=args.calibrate,
                        program=second.name)
    if args.measure:
        from hlofuse.report import measure

        def progress(line: str) -> None:
            if not args.quiet:
                print(f"{PROG}: --measure: {line}", file=sys.stderr, flush=True)

        progress("compiling for this CPU" + (" (both programs)" if other is not None else ""))
        if other is not None:
            report.measured, other.measured = ({"host": m} for m in measure.measure_pair(
                loaded.module, second.module, fuse=args.fuse, runs=args.runs, progress=progress))
        else:
            report.measured = {"host": measure.measure_module(loaded.module, fuse=args.fuse, runs=args.runs,
                                                              progress=progress)}
    to_stdout = args.json == "-"
    if not args.quiet and not to_stdout:
        sys.stdout.write(render.text(report, args.top))
        if other is not None:
            sys.stdout.write(render.compare_text(report, other, args.top))
    if args.json:
        _write(args.json, render.to_json(report, other) + "\n")
    if args.html:
        _write(args.html, render.to_html(report, other))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    try:
        return run(argv)
    except UsageError as error:
        print(f"{PROG}: error: {error}", file=sys.stderr)
        return 1
    except Exception as error:  # one line, as hlofuse-opt prints errors
        from hlofuse.ir.loader import LoadError

        if debug:
            traceback.print_exc()
        if isinstance(error, LoadError):
            print(str(error), file=sys.stderr)
        else:
            print(f"{PROG}: error: {type(error).__name__}: {' '.join(str(error).split())}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
