"""hlofuse-opt: parse a program, run a pass pipeline over it, print it. Follows mlir-opt's conventions.

Any input form JAX or XLA writes is accepted (see hlofuse.ir.loader). hlofuse passes and upstream MLIR
passes mix in one pipeline, given either as `--pass-pipeline='builtin.module(...)'` or as one flag per
pass in order (`--canonicalize --hlofuse-fuse-attention`). Errors print one `file:line:col: error:` line
and exit 1; `--debug` adds the traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import sys
import tempfile
import traceback
import typing
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, BinaryIO, TextIO

from jaxlib.mlir import ir, passmanager

from hlofuse import compile_targets, pipeline
from hlofuse.ir import loader
from hlofuse.ir.context import make_context

PROG = "hlofuse-opt"
SPLIT_MARKER = "// -----"
_SPLIT_LINE = re.compile(r"^[ \t]*// -----[ \t\r]*$", re.MULTILINE)

# Upstream passes that get their own flag in --help; any other registered pass also works as `--<name>`.
UPSTREAM_FLAGS = {
    "canonicalize": "canonicalize operations (upstream MLIR)",
    "cse": "eliminate common sub-expressions (upstream MLIR)",
    "inline": "inline calls (upstream MLIR)",
    "symbol-dce": "erase unused private symbols (upstream MLIR)",
}

EXAMPLES = """\
examples:
  hlofuse-opt model.mlir --hlofuse-fuse-attention
  hlofuse-opt in.mlir --pass-pipeline='builtin.module(hlofuse-prepare,hlofuse-fuse-attention)' -o out.mlir
  hlofuse-opt cases.mlir --split-input-file --canonicalize --cse | filecheck cases.mlir
  hlofuse-opt dump/module_0001.jit_f.before_optimizations.txt --hlofuse-lower-kernels=target=cpu
  hlofuse-opt f.jax_export --remarks --print-stats --hlofuse-fuse-attention
  cat module.mlir | hlofuse-opt - --cse
  hlofuse-opt attention.mlir --compile-for=tpu-v5e -o /dev/null   # lower and compile each kernel for a v5e

inputs (detected from content): StableHLO/MLIR text or bytecode, jax.export artifacts, StableHLO
portable artifacts, XLA HLO text (*.before_optimizations.txt), HLO protos (*.hlo.pb). See docs/hlofuse-opt.md.
"""


class UsageError(Exception):
    """A bad command line: reported as one line and exit code 1, as mlir-opt does."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> typing.NoReturn:
        raise UsageError(message)


@dataclass
class Options:
    input: str = "-"
    output: str = "-"
    split_input_file: bool = False
    pass_pipeline: str | None = None
    pass_flags: list[str] = field(default_factory=list)
    remarks: bool = False
    print_stats: bool = False
    emit_bytecode: bool = False
    debuginfo: bool = False
    debug: bool = False
    compile_for: str | None = None


class _AppendPass(argparse.Action):
    """Appends one pipeline element to `pass_flags`, so pass flags keep their command-line order."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,  # noqa: ANN401 - argparse passes str, list or None
        option: str | None = None,
    ) -> None:
        element = values if isinstance(values, str) else (option or "--")[2:]
        namespace.pass_flags = [*getattr(namespace, "pass_flags", []), element]


def pass_element(name: str, options: str | None) -> str:
    """`name{k=v k2=v2}` from a flag value such as `k=v,k2=v2`, `k=v k2=v2` or `{k=v}`."""
    if not options:
        return name
    text = options.strip()
    if text.startswith("{") and text.endswith("}"):
        text = text[1:-1]
    items = [item for item in re.split(r"[\s,]+", text) if item]
    return f"{name}{{{' '.join(items)}}}"


def _hlofuse_pass_help(name: str) -> str:
    try:
        cls = pipeline.pass_class(name)
    except ImportError as error:
        return f"(unavailable: {error})"
    options = " ".join(f"{option}={default!r}" for option, _kind, default in pipeline.pass_options(cls))
    return f"{cls.summary}" + (f" [options: {options}]" if options else "")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog=PROG,
        description="Run hlofuse and MLIR passes over StableHLO programs (mlir-opt conventions).",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    parser.add_argument("input", nargs="?", default="-", help="input file, '-' for stdin (default)")
    parser.add_argument("-o", dest="output", default="-", metavar="FILE", help="output file (default stdout)")
    parser.add_argument(
        "--split-input-file",
        action="store_true",
        help=f"split the input on '{SPLIT_MARKER}' lines and process each chunk independently",
    )
    parser.add_argument(
        "--pass-pipeline",
        metavar="PIPELINE",
        help="a textual pipeline, e.g. 'builtin.module(canonicalize,cse)'",
    )
    parser.add_argument(
        "--list-passes", action="store_true", help="list hlofuse passes with their options, then exit"
    )
    parser.add_argument("--remarks", action="store_true", help="print each pass remark to stderr")
    parser.add_argument("--print-stats", action="store_true", help="print rule match counters to stderr")
    parser.add_argument("--emit-bytecode", action="store_true", help="write MLIR bytecode instead of text")
    parser.add_argument(
        "--mlir-print-debuginfo", dest="debuginfo", action="store_true", help="print locations"
    )
    parser.add_argument("--debug", action="store_true", help="show Python tracebacks and diagnostic notes")
    parser.add_argument(
        "--compile-for",
        metavar="CHIP",
        choices=sorted(compile_targets.CHIPS),
        help="compile each kernel call, then the module, for CHIP on this host ("
        + ", ".join(compile_targets.CHIPS)
        + "); one line per kernel on stderr; without a pipeline, runs 'default' for CHIP's kernels",
    )
    parser.add_argument("--version", action="store_true", help="print versions, then exit")
    parser.add_argument(_ELEMENT_FLAG, action=_AppendPass, help=argparse.SUPPRESS)
    group = parser.add_argument_group(
        "passes",
        "one flag per pass, run in the order given; options as --PASS=key=value[,key=value]. Any other\n"
        "registered MLIR pass works the same way (--stablehlo-legalize-composite-to-call, ...).",
    )
    for name in sorted(pipeline.PASS_CLASSES):
        group.add_argument(f"--{name}", nargs=0, action=_AppendPass, help=_hlofuse_pass_help(name))
    for name, help_text in UPSTREAM_FLAGS.items():
        group.add_argument(f"--{name}", nargs=0, action=_AppendPass, help=help_text)
    parser.set_defaults(pass_flags=[])
    return parser


_ELEMENT_FLAG = "--pass-element"
_LONG_FLAG = re.compile(r"--([A-Za-z][\w.-]*)(?:=(.*))?", re.DOTALL)


def _rewrite_pass_flags(argv: Sequence[str], parser: argparse.ArgumentParser) -> list[str]:
    """`--PASS=opts` and unknown `--NAME[=opts]` become `--pass-element=ELEMENT`, in place.

    Pass options only come after `=` (as in mlir-opt), so `--cse input.mlir` never eats the input."""
    own = {flag for flag in parser._option_string_actions if not _is_pass_flag(flag[2:])}
    rewritten: list[str] = []
    for index, arg in enumerate(argv):
        if arg == "--":
            return rewritten + list(argv[index:])
        match = _LONG_FLAG.fullmatch(arg)
        previous = argv[index - 1] if index else ""
        takes_value = previous in ("-o", "--pass-pipeline") and "=" not in previous
        if match is None or takes_value or "--" + match.group(1) in own:
            rewritten.append(arg)
            continue
        rewritten.append(f"{_ELEMENT_FLAG}={pass_element(match.group(1), match.group(2))}")
    return rewritten


def _is_pass_flag(name: str) -> bool:
    return name in pipeline.PASS_CLASSES or name in UPSTREAM_FLAGS


def parse_args(argv: Sequence[str]) -> Options | None:
    """Options from `argv`; None after `--version` or `--list-passes` were answered."""
    parser = build_parser()
    namespace = parser.parse_args(_rewrite_pass_flags(argv, parser))
    if namespace.version:
        print(version_text())
        return None
    if namespace.list_passes:
        print(list_passes_text(), end="")
        return None
    options = Options(
        input=namespace.input,
        output=namespace.output,
        split_input_file=namespace.split_input_file,
        pass_pipeline=namespace.pass_pipeline,
        pass_flags=list(namespace.pass_flags),
        remarks=namespace.remarks,
        print_stats=namespace.print_stats,
        emit_bytecode=namespace.emit_bytecode,
        debuginfo=namespace.debuginfo,
        debug=namespace.debug,
        compile_for=namespace.compile_for,
    )
    if options.pass_pipeline is not None and options.pass_flags:
        raise UsageError(
            "--pass-pipeline cannot be combined with pass flags such as --" + options.pass_flags[0]
        )
    if options.emit_bytecode and options.split_input_file:
        raise UsageError("--emit-bytecode cannot be combined with --split-input-file")
    return options


def version_text() -> str:
    import jax
    import jaxlib

    import hlofuse

    return f"{PROG} (hlofuse {hlofuse.__version__}, jax {jax.__version__}, jaxlib {jaxlib.__version__})"


def list_passes_text() -> str:
    """Every hlofuse pass with its summary and options; a pass whose module cannot import says why."""
    lines = ["hlofuse passes:"]
    for name in sorted(pipeline.PASS_CLASSES):
        try:
            cls = pipeline.pass_class(name)
        except ImportError as error:
            lines.append(f"  {name}  (unavailable: {error})")
            continue
        lines.append(f"  {name}  {cls.summary}".rstrip())
        for option, kind, default in pipeline.pass_options(cls):
            lines.append(f"    {option}: {kind} = {default!r}")
    lines.append("named pipelines:")
    lines.append(
        "  " + ", ".join(pipeline.DEFAULT_PIPELINE_NAMES) + "  " + pipeline.default_pipeline("TARGET")
    )
    lines.append(
        "upstream MLIR passes (canonicalize, cse, inline, stablehlo-*, ...) mix into the same pipeline"
    )
    return "\n".join(lines) + "\n"


# ---- running ------------------------------------------------------------------------------------------


def pipeline_text(options: Options) -> str | None:
    """The pipeline to run, or None for parse-and-print (`default` when compiling for a chip)."""
    if options.pass_pipeline is not None:
        return options.pass_pipeline
    if not options.pass_flags:
        return "default" if options.compile_for else None
    return "builtin.module(" + ",".join(options.pass_flags) + ")"


def kernel_target(options: Options) -> str | None:
    """The target a `default` pipeline lowers for: the chip's kernels under --compile-for, else none."""
    return compile_targets.chip(options.compile_for).kernel_target if options.compile_for else None


def _nest_function_passes(text: str, context: ir.Context) -> str:
    """Wraps upstream elements anchored on func.func in `func.func(...)`, as mlir-opt's flags do."""
    if not (text.startswith("builtin.module(") and text.endswith(")")):
        return text
    elements = list(pipeline._split_top_level(text[len("builtin.module(") : -1]))
    nested = []
    for element in elements:
        name = element.split("{", 1)[0].strip()
        if name.startswith("hlofuse-") or "(" in element or name in pipeline.DEFAULT_PIPELINE_NAMES:
            nested.append(element)
            continue
        with context:
            try:
                passmanager.PassManager("builtin.module").add(element)
            except ValueError as error:
                if "did you intend to nest" in str(error):
                    element = f"func.func({element})"
        nested.append(element)
    return "builtin.module(" + ",".join(nested) + ")"


@dataclass
class ChunkResult:
    ok: bool
    text: str = ""
    data: bytes = b""


class Diagnostics:
    """Collects diagnostics MLIR emits outside an MLIRError (warnings, remarks) and prints them."""

    def __init__(self, name: str, stderr: TextIO) -> None:
        self.name = name
        self.stderr = stderr

    def __call__(self, diagnostic: ir.Diagnostic) -> bool:
        severity = str(diagnostic.severity).rsplit(".", 1)[-1].lower()
        print(
            loader.format_diagnostic(diagnostic.location, severity, diagnostic.message, self.name),
            file=self.stderr,
        )
        return True


def one_line(message: str) -> str:
    """A multi-line MLIR message as one line: the text after its `error:`, without the caret lines."""
    text = str(message)
    if "\n" in text and "error: " in text:
        head, _, rest = text.partition("error: ")
        text = head.split("\n", 1)[0] + " " + rest.split("\n", 1)[0]
    return " ".join(text.split())


def _report(message: str, stderr: TextIO, debug: bool) -> None:
    if debug:
        traceback.print_exc(file=stderr)
    print(message, file=stderr)


def process_chunk(
    data: bytes, name: str, options: Options, context: ir.Context, stderr: TextIO
) -> ChunkResult:
    """Parses one input (or one split chunk), runs the pipeline, prints; reports any failure to stderr."""
    try:
        loaded = loader.load_bytes(data, name, context)
    except loader.LoadError as error:
        _report(str(error), stderr, options.debug)
        return ChunkResult(False)
    module = loaded.module
    text = pipeline_text(options)
    try:
        if text is not None:
            with _chip_scope(options):
                result = pipeline.run_pipeline(module, text, target=kernel_target(options))
            if options.remarks:
                for remark in result.remarks:
                    print(str(remark), file=stderr)
            if options.print_stats:
                _print_stats(result.counters, stderr)
    except pipeline.PipelineError as error:
        _report(f"{PROG}: error: invalid pipeline: {one_line(str(error))}", stderr, options.debug)
        return ChunkResult(False)
    except pipeline.PassFailure as error:
        _report(f"{name}: error: {error}", stderr, options.debug)
        return ChunkResult(False)
    except ir.MLIRError as error:
        for line in loader.format_mlir_error(error, name, notes=options.debug):
            _report(line, stderr, options.debug)
        return ChunkResult(False)
    except ValueError as error:  # MLIR's pipeline parser rejects an unknown upstream pass or option
        _report(f"{PROG}: error: invalid pipeline: {one_line(str(error))}", stderr, options.debug)
        return ChunkResult(False)
    if options.compile_for and not _compile_for(module, name, options, stderr):
        return ChunkResult(False)
    if options.emit_bytecode:
        buffer = _BytesSink()
        module.operation.write_bytecode(buffer)
        return ChunkResult(True, data=bytes(buffer.data))
    return ChunkResult(True, text=module.operation.get_asm(enable_debug_info=options.debuginfo))


def _chip_scope(options: Options) -> contextlib.AbstractContextManager[None]:
    """With --compile-for, the Pallas lowerings choose tiles for, and check the limits of, that chip."""
    if not options.compile_for:
        return contextlib.nullcontext()
    from hlofuse.kernels.pallas import resources

    return resources.for_chip(options.compile_for)


def _compile_for(module: ir.Module, name: str, options: Options, stderr: TextIO) -> bool:
    """Compiles each kernel call of `module`, then the module, for the chosen chip; one line each on stderr.

    A kernel XLA compiled is a `remark` with its resources, one it rejected an `error` with the compiler's
    own message; False when any failed."""
    chip = options.compile_for
    assert chip is not None
    try:
        report = compile_targets.check_module(module, chip)
    except compile_targets.CompilerUnavailable as error:
        _report(f"{PROG}: error: --compile-for={chip}: {error}", stderr, options.debug)
        return False
    for kernel in report.kernels:
        what = f"{chip}: kernel {kernel.name} ({kernel.target})"
        if kernel.ok:
            line = f"{what} compiled: {compile_targets.describe(kernel.resources)}"
        else:
            line = f"{what} failed: {kernel.error}"
        severity = "remark" if kernel.ok else "error"
        print(loader.format_diagnostic(kernel.location, severity, line, name), file=stderr)
    count = f"{len(report.kernels)} kernel" + ("" if len(report.kernels) == 1 else "s")
    if report.ok is None:
        print(f"{name}: remark: {chip}: module not compiled: {report.error}", file=stderr)
    elif report.ok:
        print(f"{name}: remark: {chip}: module compiled ({count}): "
              f"{compile_targets.describe(report.resources)}", file=stderr)
    else:
        print(f"{name}: error: {chip}: module failed ({count}): {report.error}", file=stderr)
    return not report.failed


class _BytesSink:
    def __init__(self) -> None:
        self.data = bytearray()

    def write(self, chunk: bytes) -> int:
        self.data += chunk
        return len(chunk)


def _print_stats(counters: Any, stderr: TextIO) -> None:  # noqa: ANN401 - a Counter[str]
    print("===--- hlofuse statistics ---===", file=stderr)
    if not counters:
        print("  (no rule matched)", file=stderr)
    for rule, count in sorted(counters.items()):
        print(f"  {count:6d} {rule}", file=stderr)


def split_chunks(text: str) -> list[str]:
    """The input cut at `// -----` lines; each chunk keeps its original line numbers by leading newlines."""
    chunks, line = [], 0
    start = 0
    for match in _SPLIT_LINE.finditer(text):
        body = text[start : match.start()]
        chunks.append("\n" * line + body)
        line += body.count("\n") + text[match.start() : match.end()].count("\n") + 1
        start = match.end() + 1
    chunks.append("\n" * line + text[start:])
    return chunks


@contextlib.contextmanager
def _output(path: str, binary: bool) -> Iterator[BinaryIO | TextIO]:
    """stdout, a device or FIFO as it is, or a temp file next to `path` renamed over it only if the body finishes."""
    if path == "-":
        yield sys.stdout.buffer if binary else sys.stdout
        return
    if os.path.exists(path) and not os.path.isfile(path):
        # /dev/null, a FIFO, a terminal: write to it; a rename would replace the device with a file.
        with open(path, "wb" if binary else "w", encoding=None if binary else "utf-8") as handle:
            yield handle
        return
    directory = os.path.dirname(os.path.abspath(path))
    fd, temp = tempfile.mkstemp(prefix=".hlofuse-opt-", dir=directory)
    try:
        with os.fdopen(fd, "wb" if binary else "w", encoding=None if binary else "utf-8") as handle:
            yield handle
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise


class _Abort(Exception):
    """Unwinds `_output` so no partial file is kept."""


def run(options: Options, stderr: TextIO) -> int:
    try:
        from jaxlib.mlir.dialects import stablehlo

        stablehlo.register_stablehlo_passes()
    except (ImportError, AttributeError):
        pass
    name = loader.display_name(options.input)
    try:
        data = loader.read_input(options.input)
    except loader.LoadError as error:
        _report(str(error), stderr, options.debug)
        return 1
    if options.compile_for:
        compile_targets.prepare(options.compile_for, cpu_backends=True)  # before JAX or libtpu start
    context = make_context()
    context.attach_diagnostic_handler(Diagnostics(name, stderr))
    text = pipeline_text(options)
    if text is not None:
        # Build the pipeline once up front: a bad one is one error, not one per split chunk.
        try:
            text = _nest_function_passes(text, context)
            pipeline.build_pass_manager(text, context, pipeline.PassState(), target=kernel_target(options))
        except (ValueError, TypeError) as error:  # PipelineError, or a pass rejecting its options
            _report(f"{PROG}: error: invalid pipeline: {one_line(str(error))}", stderr, options.debug)
            return 1
        except ImportError as error:
            _report(f"{PROG}: error: pass unavailable: {error}", stderr, options.debug)
            return 1
        options.pass_pipeline, options.pass_flags = text, []
    if options.split_input_file:
        decoded = loader._as_text(data)
        if decoded is None:
            _report(f"{name}: error: --split-input-file needs a text input", stderr, options.debug)
            return 1
        results = [
            process_chunk(c.encode("utf-8"), name, options, context, stderr) for c in split_chunks(decoded)
        ]
    else:
        results = [process_chunk(data, name, options, context, stderr)]
    failed = not all(result.ok for result in results)
    if failed and options.output != "-":
        return 1
    try:
        with _output(options.output, options.emit_bytecode) as out:
            if options.emit_bytecode:
                out.write(results[0].data)  # type: ignore[arg-type]
            else:
                out.write(f"{SPLIT_MARKER}\n".join(r.text for r in results if r.ok))  # type: ignore[arg-type]
    except OSError as error:
        _report(
            f"{options.output}: error: cannot write output: {error.strerror or error}", stderr, options.debug
        )
        return 1
    return 1 if failed else 0


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args
    try:
        options = parse_args(args)
        if options is None:
            return 0
        return run(options, sys.stderr)
    except UsageError as error:
        _report(f"{PROG}: error: {error}", sys.stderr, debug)
        return 1
    except KeyboardInterrupt:
        return 130
    except Exception as error:  # anything unforeseen still prints one line, never a traceback
        message = " ".join(str(error).split())
        _report(f"{PROG}: error: internal error: {type(error).__name__}: {message}", sys.stderr, debug)
        return 1


if __name__ == "__main__":
    sys.exit(main())
