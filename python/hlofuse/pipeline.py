"""Pass registry, pipeline strings and the driver that runs hlofuse passes beside upstream MLIR passes.

A pipeline string follows mlir-opt: `builtin.module(canonicalize,hlofuse-fuse-attention,cse)`.
Elements named `hlofuse-*` are Python passes (frozen dataclasses whose fields are their options, see
`ModulePass`); every other element goes to MLIR's own pass manager unchanged, so both kinds mix freely
in one `PassManager`. `default` (or `hlofuse-default`) names the standard pipeline.
"""

from __future__ import annotations

import dataclasses
import importlib
import threading
import typing
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

from jaxlib.mlir import ir, passmanager

from hlofuse.remarks import Remark, remark_at

# Pass name -> "module:Class". Modules import lazily so `--help` and plugin start-up stay cheap.
PASS_CLASSES: dict[str, str] = {
    "hlofuse-prepare": "hlofuse.passes.prepare:PreparePass",
    "hlofuse-fuse-attention": "hlofuse.passes.fuse_attention:FuseAttentionPass",
    "hlofuse-fuse-sampling": "hlofuse.passes.fuse_sampling:FuseSamplingPass",
    "hlofuse-lower-kernels": "hlofuse.passes.lower_kernels:LowerKernelsPass",
}

DEFAULT_PIPELINE_NAMES = ("default", "hlofuse-default")


class PipelineError(ValueError):
    """A pipeline string that cannot be parsed, or an unknown pass or option."""


class PassFailure(RuntimeError):
    """A pass raised while running; carries the pass name so callers can say which one."""

    def __init__(self, pass_name: str, cause: BaseException) -> None:
        super().__init__(f"pass '{pass_name}' failed: {type(cause).__name__}: {cause}")
        self.pass_name = pass_name
        self.cause = cause


@dataclass
class PassState:
    """What one pipeline run collects: remarks and per-rule match counts."""

    remarks: list[Remark] = field(default_factory=list)
    counters: Counter[str] = field(default_factory=Counter)
    current_pass: str = ""
    # Objects that must live as long as the run: e.g. template modules whose values a pass compares
    # against. They belong to this run only, so concurrent runs (threads compiling) never free each
    # other's (a module-level list cleared by one run once crashed another).
    keep_alive: list[object] = field(default_factory=list)

    def remark(self, op: ir.Operation | ir.OpView, reason: str) -> None:
        self.remarks.append(remark_at(self.current_pass, op, reason))

    def count(self, rule: str, n: int = 1) -> None:
        self.counters[rule] += n


@dataclass(frozen=True)
class ModulePass:
    """Base of every hlofuse pass: a frozen dataclass whose typed fields are its options.

    Subclasses set `name` and `summary`; their docstring is the `--help` text.
    """

    name: ClassVar[str] = ""
    summary: ClassVar[str] = ""

    def run(self, module: ir.Operation, state: PassState) -> None:
        raise NotImplementedError


@dataclass
class PipelineResult:
    remarks: list[Remark]
    counters: Counter[str]


# Process-wide match counters, summed over every run: tests read them after a jax.jit compile.
_stats_lock = threading.Lock()
STATS: Counter[str] = Counter()


def pass_class(name: str) -> type[ModulePass]:
    try:
        target = PASS_CLASSES[name]
    except KeyError:
        known = ", ".join(sorted(PASS_CLASSES))
        raise PipelineError(f"unknown hlofuse pass '{name}' (known: {known})") from None
    module_name, class_name = target.split(":")
    return getattr(importlib.import_module(module_name), class_name)


def list_passes() -> list[tuple[str, str]]:
    """(name, summary) of every hlofuse pass, sorted by name."""
    return [(name, pass_class(name).summary) for name in sorted(PASS_CLASSES)]


def pass_options(cls: type[ModulePass]) -> list[tuple[str, str, Any]]:
    """(option, type name, default) of a pass."""
    hints = typing.get_type_hints(cls)
    return [
        (f.name, getattr(hints[f.name], "__name__", str(hints[f.name])), f.default) for f in dataclasses.fields(cls)
    ]


def _split_top_level(text: str, sep: str = ",") -> Iterator[str]:
    depth, start = 0, 0
    for i, ch in enumerate(text):
        if ch in "({":
            depth += 1
        elif ch in ")}":
            depth -= 1
            if depth < 0:
                raise PipelineError(f"unbalanced ')' or '}}' in pipeline '{text}'")
        elif ch == sep and depth == 0:
            yield text[start:i].strip()
            start = i + 1
    if depth != 0:
        raise PipelineError(f"unbalanced '(' or '{{' in pipeline '{text}'")
    tail = text[start:].strip()
    if tail:
        yield tail


def _parse_options(text: str) -> dict[str, str]:
    options = {}
    for item in text.split():
        key, eq, value = item.partition("=")
        if not eq:
            raise PipelineError(f"option '{item}' is not of the form key=value")
        options[key.strip()] = value.strip()
    return options


def _convert_option(pass_name: str, key: str, value: str, kind: Any) -> Any:  # noqa: ANN401
    if kind is bool:
        if value.lower() in ("true", "1", "on"):
            return True
        if value.lower() in ("false", "0", "off"):
            return False
        raise PipelineError(f"option '{key}' of '{pass_name}' takes true or false, not '{value}'")
    try:
        return kind(value)
    except ValueError:
        raise PipelineError(f"option '{key}' of '{pass_name}' takes a {kind.__name__}, not '{value}'") from None


def instantiate(name: str, options: dict[str, str]) -> ModulePass:
    cls = pass_class(name)
    hints = typing.get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in options.items():
        if key not in known:
            listed = ", ".join(sorted(known)) or "none"
            raise PipelineError(f"unknown option '{key}' for pass '{name}' (options: {listed})")
        kwargs[key] = _convert_option(name, key, value, hints[key])
    return cls(**kwargs)


def default_pipeline(target: str | None) -> str:
    """The standard pipeline: normalise, fuse, then lower the composites a `target` kernel supports.

    Sampling fuses before attention: a sampler's softmax (top-p, min-p) then sits in the sample
    composite's decomposition, which the attention pass skips, instead of being reported as an attention
    near-miss."""
    lower = f",hlofuse-lower-kernels{{target={target}}}" if target else ""
    return f"builtin.module(hlofuse-prepare,hlofuse-fuse-sampling,hlofuse-fuse-attention{lower})"


@dataclass(frozen=True)
class _Element:
    name: str
    options: dict[str, str]
    text: str


def _elements(pipeline: str, target: str | None) -> list[_Element]:
    text = pipeline.strip()
    if not text:
        raise PipelineError("empty pipeline")
    if text in DEFAULT_PIPELINE_NAMES:
        text = default_pipeline(target)
    if text.startswith("builtin.module(") and text.endswith(")"):
        text = text[len("builtin.module(") : -1]
    elements = []
    for item in _split_top_level(text):
        name, brace, rest = item.partition("{")
        name = name.strip()
        options: dict[str, str] = {}
        if brace:
            if not rest.endswith("}"):
                raise PipelineError(f"malformed options in pipeline element '{item}'")
            options = _parse_options(rest[:-1])
        if name in DEFAULT_PIPELINE_NAMES:
            chosen = options.pop("target", target)
            if options:
                raise PipelineError(f"'{name}' takes only the option 'target', not {sorted(options)}")
            elements.extend(_elements(default_pipeline(chosen), chosen))
            continue
        elements.append(_Element(name, options, item))
    return elements


def build_pass_manager(
    pipeline: str, context: ir.Context, state: PassState, *, target: str | None = None
) -> passmanager.PassManager:
    """A PassManager on builtin.module running `pipeline`; hlofuse passes record into `state`."""
    with context:
        manager = passmanager.PassManager("builtin.module")
        for element in _elements(pipeline, target):
            if element.name.startswith("hlofuse-"):
                instance = instantiate(element.name, element.options)
                manager.add(_callback(instance, state), name=element.name)
            else:
                try:
                    manager.add(element.text)
                except ValueError as error:
                    raise PipelineError(f"cannot add pass '{element.text}': {error}") from None
    return manager


def _callback(instance: ModulePass, state: PassState) -> Any:  # noqa: ANN401
    def run(op: ir.Operation, _pass: Any) -> None:  # noqa: ANN401
        state.current_pass = instance.name
        try:
            with op.context, ir.Location.unknown(op.context):
                instance.run(op, state)
        except Exception as error:
            raise PassFailure(instance.name, error) from error

    run.__name__ = instance.name
    return run


def validate_pipeline(pipeline: str, target: str | None = None) -> None:
    """Raises PipelineError if `pipeline` names an unknown pass or option; runs nothing."""
    for element in _elements(pipeline, target):
        if element.name.startswith("hlofuse-"):
            instantiate(element.name, element.options)


def run_pipeline(module: ir.Module, pipeline: str = "default", *, target: str | None = None) -> PipelineResult:
    """Rewrites `module` in place. Raises PipelineError, PassFailure, or ir.MLIRError."""
    state = PassState()
    manager = build_pass_manager(pipeline, module.context, state, target=target)
    manager.run(module.operation)
    with _stats_lock:
        STATS.update(state.counters)
    return PipelineResult(state.remarks, state.counters)
