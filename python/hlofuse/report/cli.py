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
input formats (as hlofuse-opt): StableHLO text or bytecode (.mlir, .mlirbc), a jax.export artifact, an XLA
HLO dump (.txt / .hlo text, .hlo.pb); '-' reads stdin. Get one from JAX with
  jax.jit(f).lower(*args).as_text()             or  XLA_FLAGS=--xla_dump_to=DIR (DIR/*/module.mlir)

what it prints, per target: the predicted time of one call (a decode step's is the per-token latency), the
regions ranked by time with their bound (compute, memory, interconnect, overhead) and share, each hlofuse
fusion with its unfused -> fused prediction, and "the next 2x": where the most time sits above its roofline
and what would move it. With --compare, per target: A and B, their delta and B/A, region by region. With
--measure: the program run on this CPU (CPU time and wall time of the median call, predicted beside it);
with --compare too, both programs are timed in turn and the measured B/A is printed beside the predicted.

examples:
  hlofuse-report model.mlir                         # every chip in the table
  hlofuse-report prefill.mlir --targets host,tpu-v5e,h100 --json out.json --html out.html
  hlofuse-report decode_gqa8.mlir --compare decode_gqa2.mlir --targets tpu-v6e,h200
  hlofuse-report step.mlir --targets host --measure  # also run it on this CPU
  hlofuse-report a.mlir --compare b.mlir --targets host --measure --runs 9   # predicted vs measured B/A

targets: all, or a comma-separated list of host (this machine), tpu-v5e, tpu-v5p, tpu-v6e, tpu-v7, h100, h200,
b200, trn1, trn2; aliases cpu, v5e, v5p, v6e, v7, trillium, ironwood, tpu7x, h100-sxm, trainium, trainium2.
python/hlofuse/report/chips.toml has every number and its source. The host's ceilings are measured once
(about 15 s) and cached in ~/.cache/hlofuse (HLOFUSE_CACHE_DIR moves it). Host predictions are validated
against measurements (docs/report.md); the TPU, GPU and Trainium ones are not.

exit status: 0 on success; 1 on any error (a missing or unreadable input, an input with nothing to model,
an unknown target, a bad option), printed as one line on stderr (--debug adds the traceback).
"""


class UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> typing.NoReturn:
        raise UsageError(message)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description="Analytical performance model of a StableHLO program per target: where\n"
                     "the time of one call goes on each chip, what bounds it, and what hlofuse's fusions gain.",
                     epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False)
    parser.add_argument("input", help="the program ('-' for stdin): any format hlofuse-opt reads (below)")
    parser.add_argument("--targets", default="all", metavar="LIST",
                        help="comma-separated targets, or 'all' (the default): see targets below")
    parser.add_argument("--json", metavar="FILE", help="write the whole report as JSON ('-' for stdout; schema in "
                        "docs/report.md: targets.<name>.predicted_s, regions[], fusions[], next[]; measured; compare)")
    parser.add_argument("--html", metavar="FILE", help="write one self-contained offline page (roofline per target, "
                        "stacked time bars, the fusion table)")
    parser.add_argument("--compare", metavar="OTHER_INPUT",
                        help="a second program B (a proposed model change), side by side with INPUT (A) per target")
    parser.add_argument("--measure", action="store_true",
                        help="also run the program on this CPU (the default pipeline for 'cpu', random arguments of "
                             "its parameter types) and compare the measured time with the host's prediction; with "
                             "--compare, both programs in turn; progress goes to stderr")
    parser.add_argument("--runs", type=int, default=5, metavar="N", help="timed calls for --measure (default: 5)")
    parser.add_argument("--no-fuse", dest="fuse", action="store_false",
                        help="model (and --measure) the program as XLA runs it without hlofuse")
    parser.add_argument("--kv-fill", type=float, default=1.0, metavar="F",
                        help="fraction in (0, 1] of the KV cache that attention sites with kv_lengths read (the "
                             "model cannot see the lengths; default: 1)")
    parser.add_argument("--top", type=int, default=8, metavar="N", help="regions shown per target (default: 8)")
    parser.add_argument("--no-calibrate", dest="calibrate", action="store_false",
                        help="use the table's host fallbacks instead of measuring this machine")
    parser.add_argument("--recalibrate", action="store_true", help="measure this machine again (about 15 s)")
    parser.add_argument("--compare-only", action="store_true",
                        help="with --compare: print only the side-by-side table, not each program's report")
    parser.add_argument("--quiet", action="store_true", help="no terminal table and no progress (with --json/--html)")
    parser.add_argument("--debug", action="store_true", help="show Python tracebacks on errors")
    return parser


def _load(path: str):  # noqa: ANN202
    from hlofuse.ir import loader

    loaded = loader.load_file(path)
    _check_has_work(loaded.module, path)
    return loaded


def _check_has_work(module, path: str) -> None:  # noqa: ANN001
    """A clear error for an input with nothing to model: no function, or a main that only returns."""
    from jaxlib.mlir import ir

    from hlofuse.report.graph import Flattener

    try:
        main = Flattener(module).main()
    except ValueError as error:
        raise UsageError(f"{path}: nothing to model: {error} (is it a StableHLO module with a main function?)") \
            from error
    name = ir.StringAttr(main.attributes["sym_name"]).value
    ops = [op for op in main.regions[0].blocks[0].operations if op.operation.name != "func.return"]
    if not ops:
        raise UsageError(f"{path}: nothing to model: @{name} has no ops (it only returns its arguments)")


def _resolve_targets(text: str) -> list[str]:
    import difflib

    from hlofuse.report import hardware

    try:
        return hardware.resolve_targets(text)
    except ValueError as error:
        known = [*hardware.DEFAULT_TARGETS, *hardware.ALIASES]
        bad = [t.strip() for t in text.split(",") if t.strip() and t.strip() not in known and t.strip() != "all"]
        close = difflib.get_close_matches(bad[0], known, n=1) if bad else []
        hint = f"; did you mean '{close[0]}'?" if close else ""
        raise UsageError(f"--targets: {error}{hint}") from error


def _write(path: str, text: str) -> None:
    if path == "-":
        sys.stdout.write(text)
        return
    target = Path(path)
    tmp = target.with_name(target.name + ".tmp")
    try:
        tmp.write_text(text)
        tmp.replace(target)
    except OSError as error:
        raise UsageError(f"cannot write {path}: {error.strerror or error}") from error


def run(argv: Sequence[str]) -> int:
    args = build_parser().parse_args(argv)
    if not 0 < args.kv_fill <= 1:
        raise UsageError("--kv-fill must be in (0, 1]")
    if args.runs < 1:
        raise UsageError("--runs must be at least 1")
    from hlofuse.report import hardware, render
    from hlofuse.report.model import analyze

    if args.compare_only and not args.compare:
        raise UsageError("--compare-only needs --compare OTHER_INPUT")
    if args.top < 1:
        raise UsageError("--top must be at least 1")
    for flag, path in (("--json", args.json), ("--html", args.html)):
        if path and path != "-" and not Path(path).resolve().parent.is_dir():
            raise UsageError(f"{flag} {path}: no such directory {str(Path(path).resolve().parent)!r}")
    targets = _resolve_targets(args.targets)
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
        if other is None or not args.compare_only:
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
