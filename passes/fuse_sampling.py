"""hlofuse-fuse-sampling: raises token sampling to `stablehlo.composite "hlofuse.sample"`.

Anchors on every draw: an argmax (JAX's variadic `reduce` of (values, iota)), or a `top_k` with k = 1 (as
`jax.random.choice` draws). For each over the last axis, it tries the sampler forms of
hlofuse.kernels.sampling_reference.FORMS (greedy, argmax of a softmax, temperature + categorical, top-k by
`lax.top_k` (or a stable argsort sliced to k) in rank space or as a mask, nucleus top-p by sort + softmax +
cumsum + threshold, min-p, top-k then top-p; each stochastic one also drawn from the log-probabilities or by
`jax.random.choice` per row): each form is lowered for the site's logits shape, dtype and k, with sentinel
constants for temperature, p and min-p, for every platform JAX lowers for (PLATFORMS: threefry is a loop on
the CPU, unrolled elsewhere), and the site is fused only if the program computes, op for op, one of those
lowerings (hlofuse.ir.template_match). The Gumbel noise therefore comes from the same threefry2x32 counters
as in JAX, and the composite's attributes plus its form reproduce the program's token ids exactly.

    %t = <sort, softmax, cumsum, select, threefry, log, argmax...>(%logits, %key)
  becomes
    %t = stablehlo.composite "hlofuse.sample" %logits, %key {composite_attributes = {form = "top_p_mask",
         k = 0 : i64, min_p = 0.0 : f64, mode = "top_p", p = 0.9 : f64, temperature = 0.7 : f64},
         decomposition = @hlofuse.sample.impl, version = 1 : i32}

A chain of filters, each applied to the last one's logits, fuses whole in any order: its last filters and draw as a
form, each filter in front of them (a writing of a STAGE_FORMS form, by its template of the logits it draws from) as
one of the composite's `stages` (`with_stages`, sampling_reference.Stage).

Sites whose interior values have users outside them are left alone (a smaller form is tried), except a searched
form whose draw's scores (its filtered logits) are what the program reads: the composite gives them back as a second
result (`scores = true`, T5X's and axlearn's log-probability of the drawn token). Every draw fed by noise or by a
softmax that is not fused gets a remark (a near-miss) naming the closest form and where the program parts from it;
a sampler fused only at its draw gets one naming the filters left in XLA, and so does an argsort sliced to k
that is not a top-k writing when the draw after it fuses as the temperature fallback. An inverse-CDF draw (a uniform
searched in a cumulative sum: `jax.random.choice(replace=True)`, torch.multinomial with replacement under torchax,
hlofuse.ir.inverse_cdf) has no form and gets a remark where the uniform meets the sum.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from math import prod
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo

from hlofuse.composites import SAMPLE, SAMPLE_VERSION, SampleAttrs
from hlofuse.ir import build
from hlofuse.ir.inverse_cdf import InverseCdfDraw, cumulative_sum_axis, inverse_cdf_draws
from hlofuse.ir.match import constant_scalar, defining_op
from hlofuse.ir.required_ops import required_ops
from hlofuse.ir.template_match import MatchReport, TemplateMatch, match_template
from hlofuse.kernels.noise import HAND_NOISES, hand_categorical, hand_noise_at_zero
from hlofuse.kernels.sampling_reference import (
    EXCESS_PRECISION_NOTE,
    FILL_BOUND,
    FILL_NOTE,
    FORMS,
    HAND_NOISE_DRAWS,
    NEUTRAL_PARAMS,
    NOISE_SCALED,
    NOISE_SCALED_ROWS,
    PRELUDES,
    SHARED_NOISE_DRAWS,
    STAGE_FORMS,
    Form,
    Stage,
    Writing,
    gives_scores,
)
from hlofuse.pipeline import ModulePass, PassState, run_pipeline
from hlofuse.remarks import format_location
from hlofuse.template_cache import cached_text

# Parameter values no program writes: the template's constants that stand for the site's parameters.
# (k: an integer, for a form that reads the k a program compares a count with, `Form.reads`; a top-k's k is its size)
SENTINELS = {"temperature": 1.2345678, "p": 0.87654321, "min_p": 0.0456789, "eps": 3.14159e-9, "epsilon": 2.71828e-4,
             "fill": -8.7654321e30, "one_minus_p": 0.0918273, "k": 1234567,
             "gumbel_eps": 2.2360679e-21, "gumbel_eps_out": 1.7320508e-22, "log_min_p": -3.0864197}
# What a constant a writing reads (`Writing.reads`) must satisfy for the writing to mean its form (the limit, why).
# (min_p: Hugging Face's writings keep their top token by torch.topk or by an argsort; for min_p <= 1 it is never
# removed anyway, so their ids agree; above 1 every other token is, and which of tied maxima stays is the writing's.)
WRITING_LIMITS = {"fill": (FILL_BOUND, FILL_NOTE),
                  "min_p": (1.0, "min_p <= 1, where the top token is never removed (which one a writing keeps)")}
THREEFRY_KS_PARITY = 0x1BD11BDA  # threefry2x32's key-schedule constant: noise is in the slice
_DTYPES = {"f32": jnp.float32, "bf16": jnp.bfloat16, "f16": jnp.float16}
_SEARCH_FORWARD = 12  # ops between the draw and the token ids (take_along_axis, reshapes, the rows stacked)


class NoMatch(Exception):
    """A draw that is not fused; the message is the remark."""


# ----- anchors -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Draw:
    """An op that picks one id per row: an argmax (JAX's variadic `reduce` of (values, iota)) over `dim`, a
    `chlo.top_k` with k = 1 (as `jax.random.choice` draws without replacement) over the last dim, or an inverse-CDF
    draw (`inverse`: where a uniform meets a cumulative sum over `dim`, as jax.random.choice draws with replacement)."""

    op: ir.Operation
    kind: str  # "argmax" | "top_k" | "inverse_cdf"
    dim: int
    inverse: InverseCdfDraw | None = None

    @property
    def values(self) -> ir.Value:
        """What the draw picks among: the argmax's or top_k's operand, the inverse-CDF draw's summed probabilities."""
        return self.inverse.cumulative.operands[0] if self.inverse is not None else self.op.operands[0]

    @property
    def ids(self) -> ir.Value:
        """The value the token ids come from: the argmax's or top_k's indices; the inverse-CDF draw's quantile."""
        return self.op.results[0] if self.inverse is not None else self.op.results[1]

    @property
    def noisy(self) -> ir.Value:
        """A value the draw's noise feeds, if it has any: the perturbed logits, or the inverse-CDF draw's quantile."""
        return self.op.results[0] if self.inverse is not None else self.op.operands[0]

    @property
    def by_rows(self) -> bool:
        """Whether the draw may be one of a row-by-row draw (jax.random.choice per row, stacked)."""
        return self.kind in ("top_k", "inverse_cdf")

    @property
    def size(self) -> int:
        return _shape(self.values)[self.dim]

    @property
    def last(self) -> bool:
        return self.dim == len(_shape(self.values)) - 1

    @property
    def unit_dims(self) -> int | None:
        """The dims after the drawn one when all have size 1 (keras' categorical draws over (..., V, 1)), else None:
        the draw is not over the vocabulary of any form."""
        after = _shape(self.values)[self.dim + 1:]
        return len(after) if all(size == 1 for size in after) else None

    def describe(self) -> str:
        if self.inverse is not None:
            return _inverse_cdf_described(self.inverse)
        what = "argmax" if self.kind == "argmax" else "top_k with k = 1"
        return what if self.last else f"{what} over dim {self.dim} (not the last)"


def _inverse_cdf_described(draw: InverseCdfDraw) -> str:
    plural = "s" * (draw.others > 1)
    rows = f" (and {draw.others} more draw{plural} of the same uniform, a row each)" if draw.others else ""
    cumulative = f"{draw.cumulative.name} at {format_location(draw.cumulative.location)}"
    return (f"an inverse-CDF draw (a uniform from the key searched in a cumulative sum, {cumulative}: "
            f"jax.random.choice(replace=True), torch.multinomial(replacement=True) under torchax){rows}")


def _draw(op: ir.Operation) -> Draw | None:
    """The draw `op` is, if any: reduce((x, iota), (init, 0)) over one dim of float x, or top_k(x, 1)."""
    if op.name == "chlo.top_k":
        x_type = ir.RankedTensorType(op.operands[0].type)
        if ir.IntegerAttr(op.attributes["k"]).value == 1 and isinstance(x_type.element_type, ir.FloatType):
            return Draw(op, "top_k", x_type.rank - 1)
        return None
    if op.name != "stablehlo.reduce" or len(op.operands) != 4 or len(op.results) != 2:
        return None
    dims = list(ir.DenseI64ArrayAttr(op.attributes["dimensions"]))
    x_type = ir.RankedTensorType(op.operands[0].type)
    iota = defining_op(op.operands[1])
    if len(dims) != 1 or iota is None or iota.name != "stablehlo.iota":
        return None
    if ir.IntegerAttr(iota.attributes["iota_dimension"]).value != dims[0]:
        return None
    return Draw(op, "argmax", dims[0]) if isinstance(x_type.element_type, ir.FloatType) else None


def _inverse_cdf_draw(draw: InverseCdfDraw) -> Draw | None:
    """The inverse-CDF draw as a site's anchor, where its cumulative sum is along a dim (jnp.cumsum's lowering)."""
    axis = cumulative_sum_axis(draw.cumulative)
    return None if axis is None else Draw(draw.op, "inverse_cdf", axis, draw)


def _backward_ops(value: ir.Value, limit: int = 4000) -> Iterator[ir.Operation]:
    seen: set[ir.Operation] = set()
    stack = [value]
    while stack and len(seen) < limit:
        op = defining_op(stack.pop())
        if op is None or op in seen:
            continue
        seen.add(op)
        yield op
        stack.extend(op.operands)


def _has_noise(value: ir.Value) -> bool:
    """Whether threefry (hence random noise) feeds `value`."""
    return any(map(_is_threefry_parity, _backward_ops(value)))


def _is_threefry_parity(op: ir.Operation) -> bool:
    """Whether `op` is threefry2x32's key-schedule constant (a ui32 splat of THREEFRY_KS_PARITY)."""
    if op.name != "stablehlo.constant":
        return False
    attr = op.attributes["value"]
    return (isinstance(attr, ir.DenseElementsAttr) and attr.is_splat and "ui32" in str(attr.type)
            and ir.IntegerAttr(attr.get_splat_value()).value == THREEFRY_KS_PARITY)


# threefry2x32's rotation amounts, the first four: JAX's CPU lowering carries them into its loop as a constant
THREEFRY_ROTATIONS = (13, 15, 26, 6)


def _noise_class(value: ir.Value) -> str | None:
    """The platform class (LOWERS_LIKE) the noise that feeds `value` was lowered for: "cpu" where JAX's CPU threefry
    loop computes it (a `while` that carries threefry's rotation amounts), "tpu" where threefry feeds it without such
    a loop (its rounds unrolled, as for TPU and GPU), None where no noise does."""
    noisy = False
    for op in _backward_ops(value):
        if op.name == "stablehlo.while" and _threefry_loop(op):
            return "cpu"
        noisy = noisy or _is_threefry_parity(op)
    return "tpu" if noisy else None


def _threefry_loop(loop: ir.Operation) -> bool:
    """Whether the `while` op is JAX's CPU threefry loop: threefry's rotation amounts (a ui32 constant) among its
    operands or in its body."""
    def rotations(op: ir.Operation | None) -> bool:
        return (op is not None and op.name == "stablehlo.constant" and "ui32" in str(op.results[0].type)
                and tuple(np.asarray(ir.DenseElementsAttr(op.attributes["value"])).flat) == THREEFRY_ROTATIONS)

    found = any(rotations(defining_op(operand)) for operand in loop.operands)

    def visit(op: ir.Operation) -> ir.WalkResult:
        nonlocal found
        found = found or rotations(op)
        return ir.WalkResult.INTERRUPT if found else ir.WalkResult.ADVANCE

    if not found:
        loop.walk(visit)
    return found


def _forward_values(value: ir.Value, depth: int) -> list[ir.Value]:
    """`value` and the results of ops up to `depth` uses downstream, nearest first."""
    found, frontier, seen = [value], [value], {value}
    for _ in range(depth):
        nxt = []
        for v in frontier:
            for use in v.uses:
                for result in use.owner.operation.results:
                    if result not in seen:
                        seen.add(result)
                        nxt.append(result)
        found += nxt
        frontier = nxt
    return found


# ----- templates -----------------------------------------------------------------------------------


# The platforms JAX lowers for. Some primitives lower differently on each (threefry2x32: a rolled loop on the
# CPU, unrolled rounds elsewhere), so a program matches the template lowered for its own platform, which the
# module does not record: each site tries every platform's lowering, the last one that matched first.
PLATFORMS = ("cpu", "tpu", "cuda", "rocm")
# The platform whose lowering each one shares, text for text, for every form (test_sampling_templates checks it
# for each form and writing): only the CPU lowers threefry as a loop. Each site lowers a form once per class.
LOWERS_LIKE = {"cpu": "cpu", "tpu": "tpu", "cuda": "tpu", "rocm": "tpu"}
_LOWERING_CLASSES = tuple(dict.fromkeys(LOWERS_LIKE[p] for p in PLATFORMS))
# The only ops that one class's lowering of a writing has and another's lacks: the CPU's threefry loop and its
# compares, and reshapes (the unrolled rounds keep some that hlofuse-prepare folds into broadcasts on the CPU)
# (test_sampling_templates checks it for every form and writing). A template that lacks any other op of the program
# lacks it on every platform, so a site lowers no other class of that writing.
PLATFORM_VARIANT_OPS = frozenset({"stablehlo.while", "stablehlo.compare", "stablehlo.reshape"})
# Ops a writing's marker names that hlofuse-prepare's normal forms may take away from the program (a put-back by a
# scatter or a take becomes a sort_key_val; a shift's concatenate a pad): a marker of one is no requirement.
NORMALISED_AWAY_OPS = frozenset({"stablehlo.scatter", "stablehlo.gather", "stablehlo.concatenate"})
_OP_NAME = re.compile(r'(?:^|= )"?((?:stablehlo|chlo)\.\w+)', re.MULTILINE)


def _drawn_as(lead: tuple[int, ...]) -> Callable[..., jax.Array]:
    """jax.random.categorical of the rows reshaped to `lead` rows before the draw (axlearn's (B * n, V) logits drawn as
    (B, n, V)): the noise of the same counters as the rows' own, so the ids are the rows' ids, shaped `lead`."""

    def categorical(key: jax.Array, y: jax.Array, axis: int = -1, **options: Any) -> jax.Array:  # noqa: ANN401
        del axis  # the vocabulary, last
        return jax.random.categorical(key, y.reshape(*lead, y.shape[-1]), axis=-1, **options)

    return categorical


# The constants a form or writing may read (Form.params, Writing.reads) that its function takes only where it does.
_READ_CONSTANTS = ("eps", "epsilon", "fill", "one_minus_p", "log_min_p")


@functools.lru_cache(maxsize=256)
def _traced(form_name: str, writing: int, shape: tuple[int, ...], dtype: str, k: int,
            draw_lead: tuple[int, ...] = (), noise: str = "", stage: bool = False) -> jax.stages.Traced:
    """The form's `writing` traced for these logits, with sentinel parameters (one trace for every platform); with
    `draw_lead`, its rows reshaped to those before the draw (`_drawn_as`); with `noise`, its categorical's noise
    written by hand (noise.HAND_NOISES, its eps sentinels; not with `draw_lead`); as a `stage`, the logits it draws
    from, of the logits alone (`Stage.filtered`)."""
    form = FORMS[form_name]
    # a floor or a fill only where the form or the writing reads one
    read = {name: SENTINELS[name] for name in _READ_CONSTANTS
            if name in form.params + form.writings[writing].reads}
    scalars = {"temperature": SENTINELS["temperature"], "k": SENTINELS["k"] if _reads_k(form) else k,
               "p": SENTINELS["p"], "min_p": SENTINELS["min_p"]}
    for name in form.row_params:  # template arguments after the key, like the composite's operands
        del scalars[name]

    if stage:
        filtered = Stage(form_name, writing, tuple({**scalars, **read}.items())).filtered
        return jax.jit(filtered).trace(jax.ShapeDtypeStruct(shape, _DTYPES[dtype]))
    drawn = {"categorical_fn": _drawn_as(draw_lead)} if draw_lead else {}
    if noise:
        if draw_lead:
            raise ValueError("a hand-written noise is matched on the rows as they are drawn only")
        drawn = {"categorical_fn": hand_categorical(noise, SENTINELS["gumbel_eps"], SENTINELS["gumbel_eps_out"])}

    def fn(logits: jax.Array, key: jax.Array, *rows: jax.Array) -> jax.Array:
        per_row = dict(zip(form.row_params, rows, strict=True))
        return form.writings[writing].fn(logits, key, **scalars, **read, **per_row, **drawn)

    key = (shape[0], 2) if form.row_keys else (2,)  # a key per row: (B, V) logits only (the draw raises otherwise)
    rows = [jax.ShapeDtypeStruct(form.row_shape(name, shape[0]), form.row_dtype(name)) for name in form.row_params]
    return jax.jit(fn).trace(jax.ShapeDtypeStruct(shape, _DTYPES[dtype]), jax.ShapeDtypeStruct(key, jnp.uint32),
                             *rows)


def _reads_k(form: Form) -> bool:
    """Whether the form's k is a constant its program reads (a searched top-k's count), not a top-k's size."""
    return "k" in form.reads


@functools.lru_cache(maxsize=512)  # texts with locations, tens of KiB each
def _template_text(form_name: str, writing: int, shape: tuple[int, ...], dtype: str, k: int, platform: str,
                   draw_lead: tuple[int, ...] = (), noise: str = "", stage: bool = False) -> tuple[str, frozenset[str]]:
    """The form's `writing` lowered for `platform` after hlofuse-prepare, and the names of its ops (the text from
    hlofuse.template_cache where a process of this install lowered it before)."""
    def lower() -> str:
        lowered = _traced(form_name, writing, shape, dtype, k, draw_lead, noise, stage).lower(
            lowering_platforms=(platform,))
        return _prepared_text(lowered.compiler_ir("stablehlo"))

    key = (form_name, writing, shape, dtype, k, platform, draw_lead) + ((noise,) if noise else ()) + ("stage",) * stage
    text = cached_text("sample", key, lower)
    return text, frozenset(_OP_NAME.findall(text))


_UNTRACEABLE = "untraceable: "  # the text kept for a writing whose trace raised (_required_ops)


@functools.lru_cache(maxsize=4096)  # (a few names each: every form's writings, as stages too, at a few shapes)
def _required_ops(form_name: str, writing: int, shape: tuple[int, ...], dtype: str, k: int,
                  draw_lead: tuple[int, ...] = (), noise: str = "", stage: bool = False) -> frozenset[str]:
    """The ops every platform's lowering of the form's `writing` holds, read from its trace (hlofuse.ir.required_ops):
    a program without one of them cannot match it, and its lowerings are skipped. Kept with the templates' texts
    (hlofuse.template_cache): tracing is most of the cost of trying a writing that the program cannot match. Raises
    ValueError where the writing does not take these logits (its trace raised)."""
    def names() -> str:
        try:
            return " ".join(sorted(required_ops(
                _traced(form_name, writing, shape, dtype, k, draw_lead, noise, stage).jaxpr.jaxpr)))
        except (ValueError, IndexError, TypeError) as error:
            return f"{_UNTRACEABLE}{type(error).__name__}: {error}"

    key = (form_name, writing, shape, dtype, k, draw_lead, noise, stage)
    text = cached_text("required-ops", key, names)
    if text.startswith(_UNTRACEABLE):
        raise ValueError(text[len(_UNTRACEABLE):])
    return frozenset(text.split())


def _prepared_text(module: ir.Module) -> str:
    """A lowered module after hlofuse-prepare, with its locations (they name each op's part of the form)."""
    module = ir.Module.parse(module.operation.get_asm(binary=True, enable_debug_info=True), context=module.context)
    run_pipeline(module, "builtin.module(hlofuse-prepare)")
    return module.operation.get_asm(enable_debug_info=True)


@functools.lru_cache(maxsize=64)
def _prelude_text(prelude: str, shape: tuple[int, ...], dtype: str, platform: str = "cpu") -> str:
    """The normalization PRELUDES[prelude] of (shape) logits lowered for `platform` after hlofuse-prepare (one
    lowering for every platform: test_sampling_templates checks that they agree)."""
    def lower() -> str:
        lowered = jax.jit(PRELUDES[prelude]).trace(jax.ShapeDtypeStruct(shape, _DTYPES[dtype])).lower(
            lowering_platforms=(platform,))
        return _prepared_text(lowered.compiler_ir("stablehlo"))

    return cached_text("prelude", (prelude, shape, dtype, platform), lower)


@functools.lru_cache(maxsize=64)
def _hand_noise_text(noise: str, shape: tuple[int, ...]) -> str:
    """The hand-written noise HAND_NOISES[noise] of a (shape) f32 uniform argument, with its eps sentinels, lowered
    after hlofuse-prepare: elementwise ops, alike on every platform."""
    writing = HAND_NOISES[noise]

    def lower() -> str:
        def fn(u: jax.Array) -> jax.Array:
            return writing.term(u, SENTINELS["gumbel_eps"], SENTINELS["gumbel_eps_out"], jnp)

        lowered = jax.jit(fn).trace(jax.ShapeDtypeStruct(shape, jnp.float32)).lower(lowering_platforms=("cpu",))
        return _prepared_text(lowered.compiler_ir("stablehlo"))

    return cached_text("hand_noise", (noise, shape), lower)


@dataclass(frozen=True)
class Template:
    root: ir.Value
    args: list[ir.Value]
    platform: str


class Templates:
    """The templates one run parsed into the program's context, by text. Their modules also go into
    `keep_alive` (the run's PassState): the template's values must outlive every match of the run."""

    def __init__(self, context: ir.Context, keep_alive: list[object]) -> None:
        self.context = context
        self.keep_alive = keep_alive
        self.parsed: dict[str, tuple[ir.Value, list[ir.Value]]] = {}
        self.missing: dict[str, frozenset[str]] = {}  # form -> the fewest template ops the program lacks
        self.skipped = False  # whether a writing went unlowered for an op its jaxpr implies (`missing` lacks it)
        self.last_platform = "cpu"  # the platform of the run's last site fused: lowered first (the order only)

    def for_site(self, form: Form, writing: int, shape: tuple[int, ...], dtype: str, k: int,
                 ops_present: set[str], draw_lead: tuple[int, ...] = (), noise_class: str | None = None,
                 skip_implied: bool = True, noise: str = "", stage: bool = False) -> Iterator[Template]:
        """The form's distinct lowerings over PLATFORMS (the last matched platform first) whose ops all occur
        in the program; of a stochastic form only the platform class its noise was lowered for, where known
        (`noise_class`: the other class's threefry cannot match it); none where the writing's jaxpr implies an op
        the program lacks (`_required_ops`, before any lowering; `skip_implied=False` lowers them all the same, to
        say in a remark which of its ops a form lacks); with `noise`, its categorical's noise written by hand; as a
        `stage`, the logits it draws from (`_traced`)."""
        order = [self.last_platform, *(p for p in _LOWERING_CLASSES if p != self.last_platform)]
        if form.stochastic and noise_class is not None and not stage:
            order = [noise_class]
        # the form does not take this shape (the choice draw: (B, V) logits only; Pax's gather by iotas of one row):
        # JAX's tracing says so with a ValueError, an IndexError or a TypeError
        try:
            required = _required_ops(form.name, writing, shape, dtype, k, draw_lead, noise, stage)
        except (ValueError, IndexError, TypeError):
            return
        if skip_implied and not required <= ops_present:  # no platform's lowering can match: none is lowered
            self.skipped = True
            return
        seen: set[str] = set()
        for platform in order:
            try:
                text, names = _template_text(form.name, writing, shape, dtype, k, platform, draw_lead, noise, stage)
            except (ValueError, IndexError, TypeError):
                return
            if text in seen:
                continue
            if not names <= ops_present:
                lacks = names - ops_present
                shared = lacks - PLATFORM_VARIANT_OPS  # what every class's lowering of this writing lacks
                self._note_missing(form.name, shared or lacks)
                if shared:  # no other class can match: lowering them too would only cost time
                    return
                continue
            seen.add(text)
            root, args = self._parse(text)
            yield Template(root, args if form.stochastic and not stage else args[:1], platform)

    def hand_noise(self, noise: str, shape: tuple[int, ...]) -> Template:
        """The hand-written noise HAND_NOISES[noise] of a (shape) f32 uniform (its one argument), parsed."""
        root, args = self._parse(_hand_noise_text(noise, shape))
        return Template(root, args, "cpu")

    def _note_missing(self, form_name: str, lacks: frozenset[str]) -> None:
        """Keeps the fewest ops a lowering of the form lacks, for its remark."""
        if form_name not in self.missing or len(lacks) < len(self.missing[form_name]):
            self.missing[form_name] = lacks

    def prelude(self, prelude: str, shape: tuple[int, ...], dtype: str) -> Template:
        """The normalization PRELUDES[prelude] of (shape) logits, parsed."""
        root, args = self._parse(_prelude_text(prelude, shape, dtype))
        return Template(root, args, "cpu")

    def _parse(self, text: str) -> tuple[ir.Value, list[ir.Value]]:
        if text not in self.parsed:
            module = ir.Module.parse(text, context=self.context)
            self.keep_alive.append(module)
            main = next(op for op in module.body.operations
                        if ir.StringAttr(op.attributes["sym_name"]).value == "main")
            block = main.regions[0].blocks[0]
            self.parsed[text] = (list(block.operations)[-1].operation.operands[0], list(block.arguments))
        return self.parsed[text]


# ----- one site ------------------------------------------------------------------------------------


@dataclass
class Site:
    form: Form
    root: ir.Value
    match: TemplateMatch
    k: int
    unit_dims: int = 0  # size-1 dims the program's ids (the root) have after the form's: keras' (..., 1)
    drawn_as: bool = False  # the rows were reshaped before the draw (`_drawn_as`): the ids are shaped otherwise
    # Larger forms that matched but whose values the program also reads elsewhere (`_check_escapes`), each (form,
    # why): the site fell back to a form that leaves their filters in XLA.
    passed_over: tuple[tuple[str, str], ...] = ()
    # The scores the draw perturbs, where the program also reads them (T5X's log-probability of the drawn token) and
    # the form gives them back (`gives_scores`): the composite's second result, shaped as the logits. The program
    # reads them as `scores_read`: themselves, or a reshape of them on the way to the draw (axlearn's (B, n, V)).
    scores: ir.Value | None = None
    scores_read: ir.Value | None = None
    noise: str = ""  # the draw's noise as written by hand (noise.HAND_NOISES), "" for JAX's
    stages: tuple[Stage, ...] = ()  # the filters in front of the form taken in (`with_stages`), in the program's order

    @property
    def ids_type(self) -> ir.RankedTensorType:
        """The composite's result, the form's token ids: the root's type without its trailing size-1 dims, or one id
        per row of the logits for rows reshaped before the draw."""
        root = ir.RankedTensorType(self.root.type)
        if self.drawn_as:
            return ir.RankedTensorType.get(list(_shape(self.match.leaves[0]))[:-1], root.element_type)
        return ir.RankedTensorType.get(list(root.shape)[:root.rank - self.unit_dims], root.element_type)

    @property
    def reshaped(self) -> bool:
        """Whether the program's ids are the composite's reshaped."""
        return str(self.ids_type) != str(self.root.type)

    def attrs(self) -> SampleAttrs:
        params = self.match.params
        return SampleAttrs(mode=self.form.mode, form=self.form.name,
                           temperature=params.get("temperature", 1.0), k=int(params.get("k", self.k)),
                           p=_p(params), min_p=_min_p(params), eps=params.get("eps", 0.0),
                           epsilon=params.get("epsilon", 0.0), scores=self.scores is not None,
                           fill=params.get("fill", float("-inf")), gumbel_at_zero=self._gumbel_at_zero(),
                           stages=self.stages)

    def _gumbel_at_zero(self) -> float | None:
        """The noise where the uniform is 0 of a hand-written noise (checked when the site matched), else None."""
        if not self.noise:
            return None
        return hand_noise_at_zero(self.noise, *_hand_noise_eps(self.match.params))


def _p(params: dict[str, float]) -> float:
    """The nucleus's p: the program's constant, or 1 - its removal threshold 1 - p (exact in f64 for an f32 one)."""
    return 1.0 - params["one_minus_p"] if "one_minus_p" in params else params.get("p", 1.0)


def _min_p(params: dict[str, float]) -> float:
    """The min-p: the program's constant, or exp of the constant log(min_p) it holds (f32(log) of that, in f64, gives
    the f32 constant back exactly)."""
    return math.exp(params["log_min_p"]) if "log_min_p" in params else params.get("min_p", 0.0)


def _element(value: ir.Value) -> str:
    return str(ir.RankedTensorType(value.type).element_type)


def _shape(value: ir.Value) -> tuple[int, ...]:
    return tuple(ir.RankedTensorType(value.type).shape)


@dataclass(frozen=True)
class TopK:
    """A top-k in the program: what it selects from (shape, element type) and its k; `sort` is the argsort's
    sort when it is written as one."""

    shape: tuple[int, ...]
    dtype: str
    k: int
    sort: ir.Operation | None = field(default=None, compare=False)


def _top_ks(op: ir.Operation) -> list[TopK]:
    """`chlo.top_k`, or an argsort sliced to its first k ids: a 2-operand sort (values, iota) along the
    last dim whose ids, reversed along that dim or not, are sliced to [0, k). Which argsorts are a top-k
    the templates decide (only the stable descending one is)."""
    if op.name == "chlo.top_k":
        source = op.operands[0]
        return [TopK(_shape(source), _element(source), ir.IntegerAttr(op.attributes["k"]).value)]
    if op.name == "stablehlo.sort" and len(op.operands) == 1:
        return _kth_of_sort(op)
    if op.name != "stablehlo.sort" or len(op.operands) != 2:
        return []
    source = op.operands[0]
    last = len(_shape(source)) - 1
    if ir.IntegerAttr(op.attributes["dimension"]).value != last:
        return []
    ids = [op.results[1]]
    ids += [use.owner.results[0] for use in op.results[1].uses if use.owner.name == "stablehlo.reverse"
            and list(ir.DenseI64ArrayAttr(use.owner.attributes["dimensions"])) == [last]]
    found = []
    for value in ids:
        for use in value.uses:
            user = use.owner
            if user.name != "stablehlo.slice":
                continue
            starts = list(ir.DenseI64ArrayAttr(user.attributes["start_indices"]))
            strides = list(ir.DenseI64ArrayAttr(user.attributes["strides"]))
            k = _shape(user.results[0])[last]
            if not any(starts) and set(strides) == {1} and k < _shape(source)[last]:
                found.append(TopK(_shape(source), _element(source), k, op))
    return found


def _kth_of_sort(op: ir.Operation) -> list[TopK]:
    """A 1-operand sort along the last dim whose column V - k is taken (a slice or a dynamic_slice at a constant
    index, one wide): the k-th largest, as `jnp.sort(x)[..., -k]` reads it (and EasyDeL's TopKLogitsWarper,
    `jnp.sort(x)[:, ::-1][:, k - 1]`, after hlofuse-prepare's `slice_columns_of_reverses`; or where the reverse
    stays). Which are a top-k's threshold the templates decide."""
    source = op.operands[0]
    last = len(_shape(source)) - 1
    vocab = _shape(source)[last]
    if ir.IntegerAttr(op.attributes["dimension"]).value != last:
        return []
    columns = []  # (the op taking a column, whether it reads the row reversed)
    for user in (use.owner for use in op.results[0].uses):
        if user.name != "stablehlo.reverse":
            columns.append((user, False))
        elif list(ir.DenseI64ArrayAttr(user.attributes["dimensions"])) == [last]:
            columns.extend((u.owner, True) for u in user.results[0].uses)
    found = []
    for column, reversed_ in columns:
        index = _column_index(column, last)
        k = None if index is None else (index + 1 if reversed_ else vocab - index)
        if k is not None and 0 < k < vocab:
            found.append(TopK(_shape(source), _element(source), k))
    return found


def _column_index(op: ir.Operation, last: int) -> int | None:
    """The index of the one column of dim `last` that a slice or a dynamic_slice at constant indices takes."""
    if op.name not in ("stablehlo.slice", "stablehlo.dynamic_slice") or len(op.results) != 1:
        return None
    shape = _shape(op.results[0])
    if len(shape) != last + 1 or shape[last] != 1:
        return None
    if op.name == "stablehlo.slice":
        return list(ir.DenseI64ArrayAttr(op.attributes["start_indices"]))[last]
    if op.name == "stablehlo.dynamic_slice":
        index = constant_scalar(op.operands[1 + last])
        return None if index is None or index != int(index) else int(index)
    return None


def _rows(draw: Draw) -> tuple[int, ...]:
    """The batch of a draw made row by row (jax.random.choice per row, stacked by a concatenate into (B, 1);
    one row needs no concatenate): (B,)."""
    stacked = [value for value in _forward_values(draw.ids, _SEARCH_FORWARD)
               if len(_shape(value)) == 2 and _shape(value)[1] == 1]
    for value in stacked:
        op = defining_op(value)
        if op is not None and op.name == "stablehlo.concatenate":
            return _shape(value)[:1]
    # one row stacked: its (1,) ids reshaped to (1, 1) as they are (not an index computed from them, which the
    # program's other readers of the token may reshape so: a gather of its log-probability); an inverse-CDF draw's ids
    # are what its search of the quantile finds (the integer results of the loop the quantile enters)
    found = [draw.ids]
    if draw.inverse is not None:
        found += [result for use in draw.ids.uses if use.owner.name == "stablehlo.while"
                  for result in use.owner.results if _element(result) in ("i32", "i64", "ui32", "ui64")]
    one = [value for value in stacked if _shape(value)[0] == 1 and any(_reshaped_from(value, f) for f in found)]
    return (1,) if one else ()


_SHAPE_OPS = ("stablehlo.reshape", "stablehlo.broadcast_in_dim", "stablehlo.convert", "stablehlo.concatenate")


def _reshaped_from(value: ir.Value, source: ir.Value) -> bool:
    """Whether `value` is `source` through shape ops (and converts) alone."""
    while value != source:
        op = defining_op(value)
        if op is None or op.name not in _SHAPE_OPS or len(op.operands) != 1:
            return False
        value = op.operands[0]
    return True


def _unflattened_rows(draw: Draw, rows: tuple[int, ...]) -> tuple[int, ...] | None:
    """The dims the (R, 1) ids of a draw made row by row are reshaped back to, if they are: (*lead, 1) with
    prod(lead) = R (audiocraft's torch.multinomial of its (B, K, V) codebook rows flattened to (B * K, V))."""
    for value in _forward_values(draw.ids, _SEARCH_FORWARD):
        op = defining_op(value)
        shape = _shape(value)
        if (op is not None and op.name == "stablehlo.reshape" and _shape(op.operands[0]) == (*rows, 1)
                and len(shape) > 2 and shape[-1] == 1 and prod(shape[:-1]) == prod(rows)):
            return shape[:-1]
    return None


# Forms that draw among a top-k's k candidates (the draw's dim is k wide, the logits' is the top-k's source).
_RANK_SPACE = ("top_k", "temperature_top_k", "top_k_of_probs", "top_k_top_p_of_probs",
               "top_k_top_p_of_probs_normalized", "top_k_top_p_of_logits", "top_p_of_logits_exclusive",
               "top_k_top_p_of_logits_exclusive", "top_p_of_top_k_rows", "top_p_of_top_k_rows_same_key_rows",
               "top_k_noise_scaled", "top_k_top_p_noise_scaled", "top_k_noise_scaled_rows",
               "top_k_top_p_noise_scaled_rows")


def _noise_of_one_row(draw: Draw) -> bool:
    """Whether the draw's noise is one row's, broadcast over its rows (a one-row sampler vmapped with one key):
    a broadcast of a noisy (n,) into the (B, n) the draw reduces."""
    x = draw.op.operands[0]
    n = _shape(x)[-1]
    if len(_shape(x)) < 2:
        return False
    for op in _backward_ops(x, limit=400):
        if op.name != "stablehlo.broadcast_in_dim" or _shape(op.results[0])[-1:] != (n,):
            continue
        source = _shape(op.operands[0])
        one_row = source[-1:] == (n,) and all(size == 1 for size in source[:-1])
        if one_row and len(_shape(op.results[0])) >= 2 and _has_noise(op.operands[0]):
            return True
    return False


# The draws that may see their rows reshaped before the categorical: a form's own, and those that take a function of
# the rows first (the per-row and same-key draws vmap over the rows; the choice draw is no categorical).
_DRAWS_OF_ROWS = ("", "log_softmax", "log_of_softmax")


def _reshaped_rows(draw: Draw) -> tuple[int, ...] | None:
    """The shape of the rows the program reshaped into the draw's operand, if it did: a reshape into the drawn
    (*lead, V) of (R, V), R = prod(lead) != the lead (axlearn's (B * n, V) log-probabilities drawn as (B, n, V))."""
    x = draw.op.operands[0]
    drawn = _shape(x)
    if not draw.last or len(drawn) < 2:
        return None
    frontier = [x]
    for _ in range(3):  # the draw adds the noise to the reshaped rows: a few ops up, breadth first
        ops = [op for op in map(defining_op, frontier) if op is not None]
        for op in ops:
            if op.name == "stablehlo.reshape" and _shape(op.results[0]) == drawn:
                rows = _shape(op.operands[0])
                if len(rows) == 2 and rows[-1] == drawn[-1] and rows[0] == prod(drawn[:-1]) and rows[:-1] != drawn[:-1]:
                    return rows
        frontier = [v for op in ops for v in op.operands]
    return None


# A form's writing to try at a draw: (form, writing index, logits shape, dtype, k, the draw's lead rows).
Candidate = tuple[Form, int, tuple[int, ...], str, int, tuple[int, ...]]


def _candidates(draw: Draw, noisy: bool, top_ks: list[TopK], ops_present: set[str],
                key_rows: frozenset[int]) -> Iterator[Candidate]:
    """(form, writing, logits shape, dtype, k) worth lowering for this draw (a form with a key per row only where
    the program holds (B, 2) keys for its B rows: `key_rows`; one whose rows share one row's noise only where the
    program's is: `_noise_of_one_row`)."""
    x = draw.values
    shape, dtype = _shape(x)[:draw.dim + 1], _element(x)  # the trailing size-1 dims belong to the draw
    unflattened = None
    if draw.by_rows and len(shape) == 1:
        shape = _rows(draw) + shape
        unflattened = _unflattened_rows(draw, shape[:-1]) if len(shape) == 2 else None
    shared = noisy and draw.kind == "argmax" and _noise_of_one_row(draw)
    rows = _reshaped_rows(draw) if noisy and draw.kind == "argmax" else None
    writings = [(form, i, w) for form in FORMS.values() if not form.prelude_of and dtype in (form.dtypes or (dtype,))
                for i, w in enumerate(form.writings)
                if w.unit_dims == draw.unit_dims and (not w.dtypes or dtype in w.dtypes)
                and (not form.row_keys or shape[0] in key_rows)
                and (form.drawn_by not in SHARED_NOISE_DRAWS or shared)]
    # The most specific first: the most marker ops (the fallbacks, categorical and temperature, have none), then
    # the most parameters read (a writing whose program scaled before it reads no temperature); among equals, one
    # that scales inside the site, leaving no division outside the composite.
    def specific(c: tuple[Form, int, Writing]) -> tuple[int, int, bool]:
        form, _, w = c
        return -len(w.marker_ops), -(len(form.params) - w.scaled_before), w.scaled_before

    for form, writing, w in sorted(writings, key=specific):
        # (an op that only some platforms' lowerings have, the CPU's threefry loop, marks no writing: the same forms
        # are tried, and named in a remark, for a program lowered for any platform)
        required = set(w.marker_ops) - PLATFORM_VARIANT_OPS - NORMALISED_AWAY_OPS
        if form.stochastic != noisy or not required <= ops_present:
            continue
        # the rows as the program filtered them, reshaped before the draw (vocabulary-space draws of the rows only),
        # first: a form that fuses either way then takes the rows, and what computed them can be taken in too
        by_rows = rows and not form.row_params and not form.row_keys and form.filters not in _RANK_SPACE
        shapes = ([(rows, shape[:-1])] if by_rows and form.drawn_by in _DRAWS_OF_ROWS else []) + [(shape, ())]
        if unflattened is not None:  # the rows' own (*lead, V), which the program flattened to draw
            shapes.append(((*unflattened, shape[-1]), ()))
        for logits_shape, lead in shapes:
            if "k" not in form.params or _reads_k(form):
                yield form, writing, logits_shape, dtype, 0, lead
                continue
            for top_k in dict.fromkeys(top_ks):
                if form.filters in _RANK_SPACE and shape[-1] == top_k.k:
                    yield form, writing, top_k.shape, top_k.dtype, top_k.k, lead
                elif top_k.shape == logits_shape and top_k.dtype == dtype and top_k.k < logits_shape[-1]:
                    yield form, writing, logits_shape, dtype, top_k.k, lead


def _hand_noises(draw: Draw, noisy: bool, templates: Templates) -> list[str]:
    """The writings of HAND_NOISES whose noise (of any uniform, with any eps) feeds the draw's f32 operand: none where
    no noise does (`noisy`), the draw is no argmax, or a JAX uniform's `max(tiny, u + tiny)` feeds it
    (`_jax_uniform`). Matching the noise alone first keeps a site from lowering every form once per writing. A log
    with no guard matches inside a guarded one too, its uniform bound to `u + eps`: of the writings that match, those
    of the most ops are the program's (the forms' templates, whose uniform is JAX's, decide)."""
    if not noisy or draw.kind != "argmax" or _element(draw.values) != "f32" or _jax_uniform(draw.values):
        return []
    shape, ops = _shape(draw.values), list(_backward_ops(draw.values))
    found: dict[str, int] = {}  # writing -> its template's op count
    for noise, writing in HAND_NOISES.items():
        template = templates.hand_noise(noise, shape)
        root_name = defining_op(template.root).name
        if any(op.name == root_name and op.results[0].type == template.root.type
               and (not writing.subtracted or _subtracted(op.results[0]))
               and match_template(op.results[0], template.root, template.args, SENTINELS) is not None
               for op in ops):
            found[noise] = sum(1 for _ in _backward_ops(template.root))
    return [noise for noise, size in found.items() if size == max(found.values())]


def _subtracted(value: ir.Value) -> bool:
    """Whether `value` is subtracted from something (a noise's outer log `x - log(...)`, not one inside its
    negation)."""
    return any(use.owner.operation.name == "stablehlo.subtract" and use.owner.operation.operands[1] == value
               for use in value.uses)


def _noised(candidates: Iterator[Candidate], hand_noises: list[str]) -> Iterator[tuple[str, Candidate]]:
    """Each candidate with JAX's noise (""); or, where the draw's noise is written by hand (`hand_noises`, which no
    JAX-noise form can match), each that draws by a categorical of f32 logits with each of those writings."""
    if not hand_noises:
        yield from (("", candidate) for candidate in candidates)
        return

    def by_categorical(form: Form, dtype: str, lead: tuple[int, ...]) -> bool:
        """Whether the candidate draws f32 rows as they are by its categorical (the hand-written noise's place)."""
        return (dtype == "f32" and not lead and form.stochastic and form.drawn_by in HAND_NOISE_DRAWS
                and form.filters not in NOISE_SCALED + NOISE_SCALED_ROWS)

    hand = [(form, writing, shape, dtype, k, lead) for form, writing, shape, dtype, k, lead in candidates
            if by_categorical(form, dtype, lead)]
    yield from ((noise, candidate) for noise in hand_noises for candidate in hand)


def _jax_uniform(value: ir.Value) -> bool:
    """Whether a JAX uniform of minimum tiny (`max(tiny, u + tiny)`, jax.random.gumbel's) feeds `value`."""
    tiny = float(np.finfo(np.float32).tiny)
    return any(op.name == "stablehlo.maximum" and any(constant_scalar(v) == tiny for v in op.operands)
               for op in _backward_ops(value))


def _hand_noise_eps(params: dict[str, float]) -> tuple[float, float]:
    """The eps a hand-written noise's match bound, inner and outer (0 for a log with no guard: its template reads
    none)."""
    return params.get("gumbel_eps", 0.0), params.get("gumbel_eps_out", 0.0)


def _unlike_jax_noise(noise: str, found: TemplateMatch) -> str:
    """Why a hand-written noise with the eps the match bound is not JAX's but where the uniform is 0
    (noise.hand_noise_at_zero), "" if it is (or the noise is JAX's)."""
    if not noise:
        return ""
    try:
        hand_noise_at_zero(noise, *_hand_noise_eps(found.params))
    except ValueError as why:
        return f"a hand-written Gumbel noise: {why}"
    return ""


def _beyond_limits(params: dict[str, float]) -> str:
    """Which constant a writing reads lies beyond its limit (WRITING_LIMITS), and why that matters; "" if none."""
    for name, (bound, why) in WRITING_LIMITS.items():
        if name in params and not params[name] <= bound:
            return f"with {name} = {params[name]:g}, above {bound:g}: the ids are the form's only for {why}"
    return ""


def analyze(draw: Draw, top_ks: list[TopK], ops_present: set[str], templates: Templates,
            key_rows: frozenset[int] = frozenset()) -> Site:
    noise_class = _noise_class(draw.noisy)
    noisy = noise_class is not None
    templates.missing.clear()
    templates.skipped = False
    candidates: list[tuple[str, Candidate]] = []  # (noise, candidate), in the order tried
    tried: list[str] = []
    closest: tuple[tuple[int, int], str, MatchReport] | None = None
    limits_missed: list[str] = []
    escaped: list[tuple[str, str]] = []  # forms that matched, each with a value the program also reads elsewhere
    hand_noises = _hand_noises(draw, noisy, templates)
    forms = _candidates(draw, noisy, top_ks, ops_present, key_rows)
    for noise, (form, writing, shape, dtype, k, lead) in _noised(forms, hand_noises):
        if dtype not in _DTYPES or form.draw != draw.kind:
            continue
        if form.name not in tried:
            tried.append(form.name)
        candidates.append((noise, (form, writing, shape, dtype, k, lead)))
        for template in templates.for_site(form, writing, shape, dtype, k, ops_present, lead, noise_class,
                                           noise=noise):
            root_name = defining_op(template.root).name
            for root in _forward_values(draw.ids, _SEARCH_FORWARD):
                op = defining_op(root)
                if op is None or op.name != root_name or str(root.type) != str(template.root.type):
                    continue
                report = MatchReport()
                found = match_template(root, template.root, template.args, SENTINELS, report)
                if found is not None and (beyond := _beyond_limits(found.params) or _unlike_jax_noise(noise, found)):
                    limits_missed.append(f"`{form.name}` ({beyond})")
                    continue
                if found is not None:
                    site = Site(form, root, found, k, draw.unit_dims or 0, bool(lead), tuple(escaped), noise=noise)
                    site = _with_scores(site, draw)
                    try:
                        _check_escapes(site, _interior(site))
                    except NoMatch as escape:  # a smaller form may leave that value to XLA: try the next
                        escaped.append((form.name, str(escape)))
                        continue
                    templates.last_platform = template.platform
                    return site
                # (the most ops matched; among equals the plainest, the fewest marker ops: a form whose filter the
                # program lacks matches no more of it than the bare draw does)
                rank = (report.matched, -len(form.writings[writing].marker_ops))
                if closest is None or rank > closest[0]:
                    closest = (rank, form.name, report)
    reason = _unmatched(draw, noisy, tried, hand_noises)
    if limits_missed:
        reason += "; written as " + ", ".join(limits_missed)
    if escaped:  # what stopped the forms that did match says more than how the others differ
        raise NoMatch(f"{reason}; matched as {_passed_over(escaped)}")
    if closest is None and templates.skipped:
        # The remark names the form whose template lacks the fewest ops: every candidate lowered after all, in the
        # same order, so that what each lacks is counted as without the skip (a template holding every op present
        # was already tried above).
        templates.missing.clear()
        for noise, (form, writing, shape, dtype, k, lead) in candidates:
            for _ in templates.for_site(form, writing, shape, dtype, k, ops_present, lead, noise_class, False,
                                        noise=noise):
                pass
    if closest is None and templates.missing:
        order = list(FORMS)  # among forms that lack as much, the one declared first (the plainer)
        form, lacks = min(templates.missing.items(), key=lambda item: (len(item[1]), order.index(item[0])))
        reason += f"; closest: `{form}`, whose {', '.join(sorted(lacks))} the program has none of"
    raise NoMatch(reason + (_differs(*closest[1:]) if closest else ""))


def _unmatched(draw: Draw, noisy: bool, tried: list[str], hand_noises: list[str]) -> str:
    """Why no form took `draw`, before what each form missed: the draw, what it draws from (with the writings of its
    hand-written noise), the forms tried."""
    if draw.inverse is None:
        what = "noisy logits (threefry)" if noisy else "logits"
        if hand_noises:
            what = f"noisy logits (threefry, a Gumbel noise written by hand: {' or '.join(hand_noises)})"
        return f"{draw.describe()} over {what} matches no sampler form (tried: {', '.join(tried) or 'none'})"
    if tried:  # (an inverse-CDF draw's description names what it draws from)
        return f"{draw.describe()}; matches no sampler form (tried: {', '.join(tried)})"
    drawing = ", ".join(f"`{f.name}`" for f in FORMS.values() if f.draw == draw.kind)
    return f"{draw.describe()}; no sampler form draws this way from such ops ({drawing} only)"


def _passed_over(forms: Iterable[tuple[str, str]]) -> str:
    """Forms with why each was not taken, the forms of one reason together: "`a` or `b`: why; `c`: why"."""
    by_reason: dict[str, list[str]] = {}
    for form, why in forms:
        names = by_reason.setdefault(why, [])
        if f"`{form}`" not in names:  # (a form's other writings may match too)
            names.append(f"`{form}`")
    return "; ".join(f"{' or '.join(names)}: {why}" for why, names in by_reason.items())


def with_prelude(site: Site, templates: Templates) -> Site:
    """`site` with the normalization in front of its logits taken in (axlearn's log_softmax, PRELUDES), as form
    `<form>_<prelude>`, where the program computes the site's logits operand by it; else `site` itself."""
    logits = site.match.leaves[0]
    if not isinstance(logits.type, ir.RankedTensorType) or _element(logits) not in _DTYPES:
        return site
    for prelude in PRELUDES:
        name = f"{site.form.name}_{prelude}"
        if name not in FORMS:
            continue
        template = templates.prelude(prelude, _shape(logits), _element(logits))
        found = match_template(logits, template.root, template.args, {})
        if found is not None and found.leaves[0] != logits:
            match = TemplateMatch({**site.match.leaves, 0: found.leaves[0]}, site.match.params,
                                  {**site.match.ops, **found.ops})
            return dataclasses.replace(site, form=FORMS[name], match=match)
    return site


def with_stages(site: Site, templates: Templates, top_ks: list[TopK], ops_present: set[str]) -> Site:
    """`site` with the filters in front of its logits taken in as stages (STAGE_FORMS, `Stage`): while the program
    computes the logits operand from other logits by a writing of one of those forms, and no value of it is read
    outside the sampler, that writing becomes the composite's first stage (a chain of any length, in any order).
    Not for a form with per-row operands, scores or a normalization in front, nor rows reshaped before the draw."""
    if site.form.row_params or site.scores is not None or site.drawn_as or site.form.prelude_of:
        return site
    while (taken := _stage_in_front(site, templates, top_ks, ops_present)) is not None:
        site = taken
    return site


def _stage_in_front(site: Site, templates: Templates, top_ks: list[TopK], ops_present: set[str]) -> Site | None:
    """`site` with the filter that computes its logits operand taken in as its first stage, or None."""
    logits = site.match.leaves[0]
    op = defining_op(logits)
    if op is None or _element(logits) not in _DTYPES:
        return None
    shape, dtype = _shape(logits), _element(logits)
    for name in STAGE_FORMS:
        form = FORMS[name]
        if form.dtypes and dtype not in form.dtypes:
            continue
        for writing, w in enumerate(form.writings):
            required = set(w.marker_ops) - PLATFORM_VARIANT_OPS - NORMALISED_AWAY_OPS
            if w.unit_dims or (w.dtypes and dtype not in w.dtypes) or not required <= ops_present:
                continue
            ks = [0] if "k" not in form.params else [t.k for t in dict.fromkeys(top_ks)
                                                      if t.shape == shape and t.dtype == dtype and t.k < shape[-1]]
            for k in ks:
                for template in templates.for_site(form, writing, shape, dtype, k, ops_present, stage=True):
                    found = match_template(logits, template.root, template.args, SENTINELS)
                    if found is None or found.leaves[0] == logits or _beyond_limits(found.params):
                        continue
                    taken = _taken_in(site, Stage(name, writing, _stage_params(form, w, found.params, k)), found)
                    try:
                        _check_escapes(taken, _interior(taken))
                    except NoMatch:  # (its filtered logits, or what it computes, read elsewhere: left to XLA)
                        continue
                    return taken
    return None


def _stage_params(form: Form, writing: Writing, bound: dict[str, float], k: int) -> tuple[tuple[str, float], ...]:
    """The values a stage's writing is given (those `_traced` gives it): each as its template bound it, k as its
    template's, and a parameter the template bound none of at its neutral value."""
    read = [name for name in _READ_CONSTANTS if name in form.params + writing.reads]
    values = {name: bound.get(name, NEUTRAL_PARAMS[name]) for name in ("temperature", "p", "min_p")}
    values["k"] = int(bound["k"]) if _reads_k(form) else k
    values.update({name: bound[name] for name in read})
    return tuple(values.items())


def _taken_in(site: Site, stage: Stage, found: TemplateMatch) -> Site:
    """`site` with `stage`, which `found` matched at its logits operand, in front: its logits are the stage's."""
    match = TemplateMatch({**site.match.leaves, 0: found.leaves[0]}, site.match.params,
                          {**site.match.ops, **found.ops})
    return dataclasses.replace(site, match=match, stages=(stage, *site.stages))


# What each part of a form's template is, by the reference function (or JAX's own) that its location names.
_PARTS = (("_gumbel", "the Gumbel noise"), ("_uniform", "the Gumbel noise"), ("threefry", "the Gumbel noise"),
          ("_mask_top_p", "the top-p filter"), ("mask_top_k", "the top-k filter"),
          ("top_k_by_argsort", "the top-k (argsort)"), ("min_p_masked", "the min-p filter"),
          ("softmax", "the softmax"), ("_take", "the ids mapped back (take_along_axis)"),
          ("_argmax", "the argmax"), ("noise_scaled_draw", "the draw (argmax(x + gumbel * T))"),
          ("categorical", "the draw"), ("choice", "the draw"))


def _part(value: ir.Value | None) -> str:
    op = defining_op(value) if value is not None else None
    text = str(op.location) if op is not None else ""
    found = [(text.find(key), label) for key, label in _PARTS if key in text]
    return min(found)[1] if found else "the draw"


def _differs(form: str, report: MatchReport) -> str:
    """Where the program parts from the closest form: the program's op and what the form has there."""
    user = defining_op(report.user) if report.user is not None else None
    template = defining_op(report.template) if report.template is not None else None
    # (how many of the form's ops matched picks the closest form, but is not said: the noise's ops differ in number
    # by platform, and the remark must read the same for a program lowered for any)
    if user is None:
        return f"; closest: `{form}`, where the program lacks {_part(report.template)}"
    has = f"{template.name}" if template is not None else "an operand"
    return (f"; closest: `{form}`, which differs in {_part(report.template)}: "
            f"the program has {user.name} at {format_location(user.location)} where the form has {has}")


# ----- the rewrite ---------------------------------------------------------------------------------


def _interior(site: Site) -> set[ir.Operation]:
    return set(site.match.ops.values())


# A softmax's row statistics over the logits (the max, the shifted logits, their exp, its sum): after
# hlofuse-prepare's CSE a log-softmax of the same logits (logprobs) computes them with the sampler's own
# ops. They may be shared: the decomposition recomputes its copies and the originals stay for the other
# users, which costs what the unfused program already spends on them. The sampler's stages (the
# probabilities, the scaled logits, the cumulative mass, the noise) may not.
_ROW_STATISTICS = ("stablehlo.reduce", "stablehlo.subtract", "stablehlo.exponential", "stablehlo.broadcast_in_dim",
                   "stablehlo.log",  # and the log of the sum: a log-softmax drawn from is the logprobs' too
                   "stablehlo.convert")  # and of bf16 logits, their exp widened to f32 for the sum


def _check_escapes(site: Site, interior: set[ir.Operation]) -> None:
    """Values the sampler computes from its operands (logits, key) may not be used outside it, except the
    row statistics of the logits alone (above) and the scores the composite gives back (`Site.scores`). Values
    built from constants and iotas alone (JAX lowers one broadcast of -inf or one iota for several users) may be
    shared: the decomposition gets its own clones, and the originals stay for their other users."""
    for op, result, user in _escapes(site, interior):
        if site.scores_read is None or result != site.scores_read:
            raise NoMatch(f"{op.name} inside the sampler has a user outside it ({user.name} at "
                          f"{format_location(user.location)} reads the {op.name} at "
                          f"{format_location(op.location)}; a fused sampler gives back only its ids"
                          f"{' and the scores it draws from' if gives_scores(site.form.name) else ''})")


def _escapes(site: Site, interior: set[ir.Operation]) -> Iterator[tuple[ir.Operation, ir.Value, ir.Operation]]:
    """(interior op, its result, a user outside the sampler) for each use of a value the sampler computes from its
    operands, but the row statistics of the logits alone."""
    leaves = site.match.leaves
    tainted: set[ir.Value] = set(leaves.values())
    keyed: set[ir.Value] = {leaves[i] for i in leaves if i > 0}  # leaf 0 is the logits, 1 the key
    for op in _in_dominance_order(defining_op(site.root), interior):
        if not any(v in tainted for v in op.operands):
            continue
        from_key = any(v in keyed for v in op.operands)
        for result in op.results:
            tainted.add(result)
            if from_key:
                keyed.add(result)
            if result == site.root:
                continue
            for use in result.uses:
                user = use.owner.operation
                if _inside(user, interior) or (op.name in _ROW_STATISTICS and not from_key):
                    continue
                yield op, result, user


# The filter ops a sampler's kernel stands in for, worth naming where XLA must still compute them (a sort or top-k
# over the vocabulary, a cumulative sum).
_FILTER_OPS = ("stablehlo.sort", "chlo.top_k", "stablehlo.reduce_window")


def _filters_kept_for_other_readers(site: Site) -> list[str]:
    """The sampler's filter ops (_FILTER_OPS) that the program still computes after the rewrite, for readers outside
    the sampler of the values computed from them: a row statistic shared with them (minGPT's sampler returns
    `log_softmax` of its filtered logits, which shares the softmax's max and sum), whose copies the composite's
    decomposition keeps while the originals stay for those readers. Each as "op at loc", in program order."""
    interior = _interior(site)
    ordered = _in_dominance_order(defining_op(site.root), interior)
    stack = [result for op in ordered for result in op.results
             if result != site.root and (site.scores_read is None or result != site.scores_read)  # (given back)
             and any(not _inside(use.owner.operation, interior) for use in result.uses)]
    computing: set[ir.Operation] = set()
    while stack:
        op = defining_op(stack.pop())
        if op is not None and op in interior and op not in computing:
            computing.add(op)
            stack.extend(op.operands)
    return [f"{op.name} at {format_location(op.location)}" for op in ordered
            if op in computing and op.name in _FILTER_OPS]


def _with_scores(site: Site, draw: Draw) -> Site:
    """`site` giving back the scores its draw perturbs, where those (or a reshape of them on the way to the draw) are
    all the program reads outside it and its form gives them back (`gives_scores`); else `site` itself."""
    if not gives_scores(site.form.name):
        return site
    interior = _interior(site)
    escaping = {result for _, result, _ in _escapes(site, interior)}
    if len(escaping) != 1:  # (most sites: nothing escapes, and the draw's noise need not be traced back)
        return site
    chain = _drawn_from(draw)
    read = next((v for v in chain if escaping == {v}), None)
    logits = site.match.leaves[0]
    if read is None or _shape(chain[-1]) != _shape(logits) or _element(chain[-1]) != _element(logits):
        return site
    scored = dataclasses.replace(site, scores=chain[-1], scores_read=read)
    try:  # (a reader before an operand is computed: the scores stay the program's, and a smaller form is tried)
        _composite_place(scored, defining_op(site.root), _leaves(site), interior)
    except NoMatch:
        return site
    return scored


def _leaves(site: Site) -> list[ir.Value]:
    """The composite's operands: the site's leaves in order (logits, key, per-row parameters)."""
    return [site.match.leaves[i] for i in sorted(site.match.leaves)]


def _drawn_from(draw: Draw) -> list[ir.Value]:
    """The scores an argmax draw perturbs: the operand of `noise + scores` (jax.random.categorical) that no noise
    feeds, then what each reshape that only adds or drops size-1 dims reshaped (keras' (..., V, 1), axlearn's
    (B * n, V) as (B, n, V)); [] for another draw."""
    add = defining_op(draw.op.operands[0])
    if draw.kind != "argmax" or add is None or add.name != "stablehlo.add":
        return []
    quiet = [v for v in add.operands if not _has_noise(v)]
    if len(quiet) != 1:
        return []
    chain = quiet
    while (op := defining_op(chain[-1])) is not None and _only_reshapes(op):
        chain.append(op.operands[0])
    return chain


def _only_reshapes(op: ir.Operation) -> bool:
    """Whether `op` gives its operand's elements in row-major order, shaped otherwise: a reshape, or a broadcast_in_dim
    of as many elements that keeps the dims in order."""
    if op.name == "stablehlo.reshape":
        return True
    if op.name != "stablehlo.broadcast_in_dim" or prod(_shape(op.operands[0])) != prod(_shape(op.results[0])):
        return False
    dims = list(ir.DenseI64ArrayAttr(op.attributes["broadcast_dimensions"]))
    return dims == sorted(dims)


def _in_dominance_order(root_op: ir.Operation, interior: set[ir.Operation]) -> list[ir.Operation]:
    """The interior ops the root sees, in an order where each comes after its operands: those of every block that
    encloses the root's, outermost first (a sampler inside a lax.cond branch or a loop body whose constants
    hlofuse-prepare's CSE hoisted to the function's block), then those of the root's own block, each in block
    order. (Ops nested in an interior op's regions go with it.)"""
    blocks = [op.block for op in _enclosing(root_op)]
    return [o.operation for block in reversed(blocks) for o in block.operations if o.operation in interior]


def _enclosing(op: ir.Operation) -> Iterator[ir.Operation]:
    """`op`, then each op whose region holds the one before, up to the function's body."""
    while True:
        yield op
        parent = op.parent
        if parent is None or parent.name == "func.func":
            return
        op = parent.operation


def _inside(op: ir.Operation, interior: set[ir.Operation]) -> bool:
    return any(o in interior for o in _enclosing(op))


def rewrite(site: Site, module: ir.Operation) -> ir.Operation:
    """Outlines the matched ops into @hlofuse.sample.impl and calls it through the composite."""
    interior = _interior(site)
    _check_escapes(site, interior)
    leaves = _leaves(site)
    root_op = defining_op(site.root)
    ordered = _in_dominance_order(root_op, interior)

    def body(args: list[ir.Value]) -> list[ir.Value]:
        mapping = dict(zip(leaves, args, strict=True))
        for op in ordered:
            clone = op.clone()
            _remap(clone, mapping)
            for old, new in zip(op.results, clone.results, strict=True):
                mapping[old] = new
        ids = mapping[site.root]
        scores = [mapping[site.scores]] if site.scores is not None else []
        return [stablehlo.reshape(site.ids_type, ids) if site.reshaped else ids, *scores]

    anchor = _composite_place(site, root_op, leaves, interior)
    location = root_op.location
    result_types = [site.ids_type, *([site.scores.type] if site.scores is not None else [])]
    name = build.unique_symbol(module, f"{SAMPLE}.impl")
    name = build.build_private_func(module, name, [v.type for v in leaves], body, location)
    with location, ir.InsertionPoint(anchor):
        attributes = site.attrs().ir_attributes()
        op = build.composite(SAMPLE, leaves, result_types, attributes, name, SAMPLE_VERSION)
        # The program's ids keep their (..., 1) shape: the composite's are reshaped back to it.
        ids = stablehlo.reshape(site.root.type, op.results[0]) if site.reshaped else op.results[0]
        scores = op.results[1] if site.scores is not None else None
        if site.scores_read is not None and str(site.scores_read.type) != str(site.scores.type):
            scores = stablehlo.reshape(site.scores_read.type, scores)
    site.root.replace_all_uses_with(ids)
    if site.scores_read is not None:
        for use in list(site.scores_read.uses):  # the program's other readers of the scores read the composite's
            if not _inside(use.owner.operation, interior):
                use.owner.operands[use.operand_number] = scores
    leaf_ops = [o for o in ordered if o.name in build.LEAF_OPS]
    build.erase_dead([o for o in ordered if o.name not in build.LEAF_OPS])
    build.erase_dead(leaf_ops)
    return op


def _composite_place(site: Site, root_op: ir.Operation, leaves: list[ir.Value],
                     interior: set[ir.Operation]) -> ir.Operation:
    """The op the composite goes right before: the root, which follows every operand of the sampler, or, for a
    composite that gives back its scores, the first op of the root's block that reads them outside the sampler (or
    holds one that does) if that comes earlier; raises NoMatch if an operand is computed after that op."""
    if site.scores_read is None:
        return root_op
    block = list(root_op.block.operations)
    place = {o.operation: i for i, o in enumerate(block)}
    readers = []
    for use in site.scores_read.uses:
        user = use.owner.operation
        if not _inside(user, interior):
            holder = next((o for o in _enclosing(user) if o in place), None)
            if holder is None:
                raise NoMatch(f"the scores the sampler draws from are read outside its block ({user.name} at "
                              f"{format_location(user.location)})")
            readers.append(holder)
    anchor = min([root_op, *readers], key=lambda o: place[o])
    for leaf in leaves:
        owner = defining_op(leaf)
        if owner is not None and owner in place and place[owner] >= place[anchor]:
            raise NoMatch(f"the scores the sampler draws from are read ({anchor.name} at "
                          f"{format_location(anchor.location)}) before its operand {owner.name} is computed")
    return anchor


def _remap(op: ir.Operation, mapping: dict[ir.Value, ir.Value]) -> None:
    """Rewires `op`'s operands, and those of every op nested in its regions, through `mapping`."""

    def visit(nested: ir.Operation) -> ir.WalkResult:
        for index, operand in enumerate(nested.operands):
            if operand in mapping:
                nested.operands[index] = mapping[operand]
        return ir.WalkResult.ADVANCE

    op.walk(visit)


def _key_rows(values: Iterable[ir.Value]) -> Iterator[int]:
    """B for each (B, 2) ui32 of `values`: threefry keys, one per row of B (a form with a key per row needs them)."""
    for value in values:
        if isinstance(value.type, ir.RankedTensorType) and _element(value) == "ui32":
            shape = _shape(value)
            if len(shape) == 2 and shape[1] == 2:
                yield shape[0]


def _sites(module: ir.Operation) -> Iterator[tuple[Draw, list[TopK], set[str], frozenset[int]]]:
    for fn in build.functions(module, skip_decompositions=True):
        draws: list[Draw] = []
        top_ks: list[TopK] = []
        names: set[str] = set()
        key_rows: set[int] = set(_key_rows(fn.regions[0].blocks[0].arguments))  # keys given as arguments

        def visit(op: ir.Operation, draws: list[Draw] = draws, top_ks: list[TopK] = top_ks,
                  names: set[str] = names, key_rows: set[int] = key_rows) -> ir.WalkResult:
            names.add(op.name)
            key_rows.update(_key_rows(op.results))
            draw = _draw(op)
            if draw is not None:
                draws.append(draw)
            if draw is None or draw.kind == "top_k":
                top_ks.extend(_top_ks(op))
            return ir.WalkResult.ADVANCE

        fn.walk(visit)
        draws += [d for d in map(_inverse_cdf_draw, inverse_cdf_draws(fn)) if d is not None]
        for draw in draws:
            yield draw, top_ks, names, frozenset(key_rows)


@dataclass(frozen=True)
class FuseSamplingPass(ModulePass):
    """Raises each token sampler (argmax of possibly filtered, Gumbel-perturbed logits) to
    `stablehlo.composite "hlofuse.sample"` (see module docs)."""

    name: ClassVar[str] = "hlofuse-fuse-sampling"
    summary: ClassVar[str] = "Raise greedy/temperature/top-k/top-p/min-p samplers to hlofuse.sample composites"

    def run(self, module: ir.Operation, state: PassState) -> None:
        # Draws that did not fuse, with their remark (None: none is due). A later site may absorb one (torch.topk
        # of the probabilities inside Hugging Face's min-p): it leaves the dict before the rewrite erases it, so
        # every handle here stays valid, and its remark is given only if it stays unfused to the end.
        failed: dict[ir.Operation, str | None] = {}
        templates = Templates(module.context, state.keep_alive)
        while self._fuse_one(module, state, failed, templates):
            pass  # each rewrite erases ops: collect the sites afresh
        for op, remark in failed.items():
            if remark is not None:
                state.remark(op, remark)
                state.count("sampling_not_fused")
        for op, k in _draws_of_several(module):
            state.remark(op, f"sampler not fused: {k} tokens per row drawn without replacement (chlo.top_k with k = "
                         f"{k} of noisy logits, its values unread: jax.random.categorical(..., replace=False)); "
                         "every sampler form draws one token per row")
            state.count("sampling_not_fused")

    def _fuse_one(self, module: ir.Operation, state: PassState, failed: dict[ir.Operation, str | None],
                  templates: Templates) -> bool:
        for draw, top_ks, names, key_rows in list(_sites(module)):
            if draw.op in failed:
                continue
            squeezes: list[ir.Operation] = []
            try:
                if draw.unit_dims is None:
                    raise NoMatch(f"{draw.describe()}: every sampler form draws over the last dim (or one followed "
                                  "only by size-1 dims, as keras' categorical does)")
                site, squeezes = _analyze_squeezed(draw, top_ks, names, templates, key_rows)
                near_misses = _argsorts_not_fused(site, top_ks)
                left = _parts_left_out(site, near_misses)
                kept_for_others = _filters_kept_for_other_readers(site)
                # (popped before the rewrite erases them: an erased op's handle no longer hashes as it did)
                absorbed = {op: failed.pop(op) for op in list(failed) if op in set(site.match.ops.values())}
                try:
                    composite = rewrite(site, module)
                except NoMatch:
                    failed.update(absorbed)
                    raise
            except NoMatch as reason:
                _unsqueeze_unfused(squeezes)
                fed_by = _fed_by(draw)
                due = "outside" in str(reason) or fed_by is not None
                failed[draw.op] = f"sampler not fused: {reason}{fed_by or ''}" if due else None
                continue
            _unsqueeze_unfused(squeezes)
            state.count(f"{site.form.name}_to_sample")
            for sort in near_misses:
                state.remark(sort, f"top-k by argsort not fused into the sampler (fused as `{site.form.name}` "
                             "after it): only a stable descending argsort sliced to k, jnp.argsort(x, "
                             "descending=True, stable=True)[..., :k], orders as lax.top_k (argsort(-x) puts NaN "
                             "last; a reversed ascending argsort puts a tie's higher id first)")
                state.count("argsort_top_k_not_fused")
            if kept_for_others:
                state.remark(composite, f"sampler fused as `{site.form.name}`, but XLA still computes its filter for "
                             "readers outside the sampler of values computed from it (the composite gives back only "
                             f"its ids{' and the scores it draws from' if site.scores is not None else ''}): "
                             f"{', '.join(kept_for_others)}")
                state.count("sampling_filter_kept_for_other_readers")
            if left:
                why = f"; not fused as {_passed_over(site.passed_over)}" if site.passed_over else ""
                state.remark(composite, f"sampler fused only in part: fused as `{site.form.name}`; "
                             f"{'; '.join(left)} stay{'s' if len(left) == 1 else ''} in XLA{why}")
                state.count("sampling_fused_in_part")
            return True
        return False


def _analyze_squeezed(draw: Draw, top_ks: list[TopK], names: set[str], templates: Templates,
                      key_rows: frozenset[int]) -> tuple[Site, list[ir.Operation]]:
    """`analyze` with the draw's (B, 1) ids squeezed where they end (`_squeeze_unit_ids`); failing that, where its rows
    are stacked too, a stack that what follows reads as (B, 1) (a take of rank-space candidates whose scaling no form
    writes), so that a smaller form (the draw's own) finds its root there. Returns the site and the reshapes back to
    remove (`_unsqueeze_unfused`); raises the first attempt's NoMatch, whose reason names the closest form."""
    def fused() -> Site:  # (with the normalization and the filters in front of its logits taken in)
        site = with_prelude(analyze(draw, top_ks, names, templates, key_rows), templates)
        return with_stages(site, templates, top_ks, names)

    squeezes = _squeeze_unit_ids(draw)
    try:
        return fused(), squeezes
    except NoMatch as first:
        _unsqueeze_unfused(squeezes)
        stacks = _squeeze_unit_ids(draw, stacks=True)
        if not stacks:
            raise
        try:
            return fused(), stacks
        except NoMatch:
            _unsqueeze_unfused(stacks)
            raise first from None


def _squeeze_unit_ids(draw: Draw, stacks: bool = False) -> list[ir.Operation]:
    """Where a draw made row by row leaves its ids (B, 1) (`torch.multinomial(probs, 1)` as nanoGPT and most torch
    samplers return it, unsqueezed), a reshape to (B,) and one back after them, so that the `_choice` forms, whose
    references end in that reshape (`.squeeze(1)`, `.reshape(-1)`), find their root there: the ids the draw's ids
    reach (`_forward_values`) that are (B, 1) integers, and from which no other B integers follow (the last of the
    chain: after a gather of the sorted ids, the gathered, not its index; none where the rows are reshaped back to
    (..., K, 1), `_unflattened_rows`). Returns the reshapes back
    (`_unsqueeze_unfused` removes each pair the site did not take). With `stacks`: after the (B, 1) stack of the rows'
    ids (their concatenate, or one row's ids reshaped) instead, whatever follows it."""
    rows = _rows(draw)
    backs = []
    for value in _forward_values(draw.ids, _SEARCH_FORWARD) if rows else []:
        if _shape(value) != (rows[0], 1) or not _ids_of(value, rows[0]):
            continue
        if stacks:  # the rows' stack, or one row's ids as they are
            if defining_op(value).name != "stablehlo.concatenate" and not _reshaped_from(value, draw.ids):
                continue
        elif any(_ids_of(later, rows[0]) for later in _forward_values(value, _SEARCH_FORWARD)[1:]):
            continue
        element = ir.RankedTensorType(value.type).element_type
        uses = list(value.uses)
        with defining_op(value).location, ir.InsertionPoint.after(defining_op(value)):
            squeezed = stablehlo.reshape(ir.RankedTensorType.get([rows[0]], element), value)
            back = stablehlo.reshape(value.type, squeezed)
        for use in uses:
            use.owner.operands[use.operand_number] = back
        backs.append(defining_op(back))
    return backs


def _ids_of(value: ir.Value, rows: int) -> bool:
    """Whether `value` may be ids of `rows` rows: `rows` integers (not booleans), in any shape."""
    if not isinstance(value.type, ir.RankedTensorType):
        return False
    element = ir.RankedTensorType(value.type).element_type
    return isinstance(element, ir.IntegerType) and element.width > 1 and prod(_shape(value)) == rows


def _unsqueeze_unfused(backs: list[ir.Operation]) -> None:
    """Removes each reshape pair of `_squeeze_unit_ids` whose squeeze the site did not take (a site rooted there
    replaced it by its composite's ids): the program's ids are read as they were."""
    for back in backs:
        squeeze = defining_op(back.operands[0])  # the site's ids, where it took the squeeze
        if squeeze is None or squeeze.name != "stablehlo.reshape" or squeeze.operands[0].type != back.results[0].type:
            continue
        back.results[0].replace_all_uses_with(squeeze.operands[0])
        back.erase()
        squeeze.erase()


_FALLBACK_FORMS = ("temperature", "categorical")  # what a filter written another way fuses as (any draw)


def _argsorts_not_fused(site: Site, top_ks: list[TopK]) -> list[ir.Operation]:
    """The argsort sorts that feed a site fused as a fallback form: top-k writings that were not one."""
    if site.form.filters not in _FALLBACK_FORMS:
        return []
    sorts = {top_k.sort for top_k in top_ks if top_k.sort is not None}
    upstream = {op for leaf in site.match.leaves.values() for op in _backward_ops(leaf)}
    return [sort for sort in sorts if sort in upstream]


# ----- remarks -------------------------------------------------------------------------------------

# Where the sampler's own computation ends, walking up from it: the model (its projections) and control flow.
_MODEL_OPS = ("stablehlo.dot_general", "stablehlo.dot", "stablehlo.convolution", "stablehlo.while",
              "stablehlo.case", "stablehlo.if", "func.call", "stablehlo.custom_call", "stablehlo.composite")


def _sampler_ops(value: ir.Value, limit: int = 600, bounds: list[ir.Operation] | None = None) -> list[ir.Operation]:
    """The ops that compute `value` from the model's output: the backward slice, not past _MODEL_OPS (those it
    stopped at go into `bounds`, when given)."""
    found: list[ir.Operation] = []
    seen: set[ir.Operation] = set()
    stack = [value]
    while stack and len(seen) < limit:
        op = defining_op(stack.pop())
        if op is None or op in seen:
            continue
        seen.add(op)
        if op.name in _MODEL_OPS:
            if bounds is not None:
                bounds.append(op)
            continue
        found.append(op)
        stack.extend(op.operands)
    return found


def _over(op: ir.Operation, size: int) -> bool:
    """Whether `op` works along a last dim of at least `size`: the vocabulary, or the whole of it when the fused
    draw is over candidates (a top-k's k values) selected from it."""
    value = op.operands[0] if len(op.operands) else op.results[0]
    shape = _shape(value) if isinstance(value.type, ir.RankedTensorType) else ()
    return bool(shape) and shape[-1] >= size


def _draws_of_several(module: ir.Operation) -> Iterator[tuple[ir.Operation, int]]:
    """Each top_k with k > 1 of noisy values that it gives back only the ids of (jax.random.categorical's draw without
    replacement), with its k: the draw of several tokens per row. (A top-k whose values are read filters noisy logits,
    Pax's top-k of `x + gumbel * T`: its draw has its own remark.)"""
    for fn in build.functions(module, skip_decompositions=True):
        found: list[tuple[ir.Operation, int]] = []

        def visit(op: ir.Operation, found: list[tuple[ir.Operation, int]] = found) -> ir.WalkResult:
            if op.name == "chlo.top_k" and (k := ir.IntegerAttr(op.attributes["k"]).value) > 1 \
                    and not list(op.results[0].uses) and _has_noise(op.operands[0]):
                found.append((op, k))
            return ir.WalkResult.ADVANCE

        fn.walk(visit)
        yield from found


def _fed_by(draw: Draw) -> str | None:
    """What makes `draw` a sampler's draw, for its remark: noise ("": the reason says so already) or a softmax
    over its dim; None if neither."""
    if _has_noise(draw.noisy):
        return ""
    for op in _sampler_ops(draw.values):
        if op.name == "stablehlo.exponential" and _shape(op.results[0])[-1:] == (draw.size,):
            return f" (it draws from a softmax: stablehlo.exponential at {format_location(op.location)})"
    return None


def _spans(value: ir.Value, logits: ir.Value) -> bool:
    """Whether `value` has the logits' dims, in any order and shape, size-1 dims aside (axlearn's (B, V) rows drawn as
    (B, 1, V)): the logits themselves, or a mask over them."""
    def dims(v: ir.Value) -> list[int]:
        return sorted(size for size in _shape(v) if size != 1)

    return isinstance(value.type, ir.RankedTensorType) and len(_shape(logits)) > 0 and dims(value) == dims(logits)


def _carries(value: ir.Value, logits: ir.Value) -> bool:
    """Whether `value` may be the logits themselves: floats of their element type, spanning their dims."""
    return _spans(value, logits) and _element(value) == _element(logits)


def _approximate_top_k(op: ir.Operation) -> bool:
    """Whether `op` is lax.approx_max_k / approx_min_k's custom call (ApproxTopK; approximate on TPU)."""
    return op.name == "stablehlo.custom_call" and ir.StringAttr(op.attributes["call_target_name"]).value == "ApproxTopK"


def _masks_by_row_statistic(ops: list[ir.Operation], vocab: int) -> list[str]:
    """Each compare over the vocabulary among `ops` against a value of a reduce over it (a threshold from the row's
    max or sum, as a min-p written in logit space keeps `y >= max(y) + log(min_p)`), with that reduce."""
    found = []
    for compare in (op for op in ops if op.name == "stablehlo.compare"):
        statistics = [op for operand in compare.operands for op in _sampler_ops(operand, limit=40)
                      if op.name == "stablehlo.reduce" and _over(op, vocab)]
        if statistics:
            found.append(f"stablehlo.compare at {format_location(compare.location)} against the "
                         f"stablehlo.reduce at {format_location(statistics[0].location)}")
    return found


def _parts_left_out(site: Site, reported: list[ir.Operation]) -> list[str]:
    """The filters that compute the fused site's logits operand (a top-k, a top-p's sort and cumulative sum, a
    softmax over the vocabulary): they stay in XLA. Sorts already `reported` (argsorts) are left out."""
    logits = site.match.leaves[0]
    vocab = _shape(logits)[-1] if _shape(logits) else 0
    bounds: list[ir.Operation] = []
    ops = [op for op in _sampler_ops(logits, bounds=bounds) if op not in reported and _over(op, vocab)]
    # A loop that carries the logits themselves is the sampler's, not the model's: a threshold found by search
    # (a bisection over the values for a top-k or top-p cutoff), which stays in XLA too.
    searches = [f"stablehlo.while at {format_location(o.location)}" for o in bounds
                if o.name == "stablehlo.while" and any(_carries(v, logits) for v in o.operands)]
    # A branch on traced values that yields the logits or a mask over them (a lax.cond whose flag depends on per-row
    # parameters, as EasyDeL's eSurge applies its filters; on a traced top-p or top-k, as simply picks its mask):
    # what its branches compute stays in XLA.
    branches = [f"{o.name} at {format_location(o.location)}" for o in bounds
                if o.name in ("stablehlo.case", "stablehlo.if") and any(_spans(r, logits) for r in o.results)]
    # lax.approx_max_k's candidates (exact on the CPU, approximate on TPU, so no kernel's top-k stands in for them).
    approximate = [f"ApproxTopK at {format_location(o.location)}" for o in bounds if _approximate_top_k(o)]
    at = {name: [f"{o.name} at {format_location(o.location)}" for o in ops if o.name == name]
          for name in ("chlo.top_k", "stablehlo.sort", "stablehlo.reduce_window", "stablehlo.exponential")}
    parts = []
    full = [o for o in ops if o.name == "chlo.top_k"
            and ir.IntegerAttr(o.attributes["k"]).value == _shape(o.operands[0])[-1]]  # a sort, as JetStream writes it
    partial = [o for o in ops if o.name == "chlo.top_k" and o not in full]
    if partial:
        parts.append("the top-k filter (" + ", ".join(f"chlo.top_k at {format_location(o.location)}"
                                                      for o in partial) + ")")
    nucleus = [f"chlo.top_k at {format_location(o.location)}" for o in full] + at["stablehlo.sort"]
    if at["stablehlo.reduce_window"]:
        parts.append("the top-p filter (" + ", ".join(nucleus + at["stablehlo.reduce_window"]) + ")")
    elif nucleus:
        parts.append("a sort over the vocabulary (" + ", ".join(nucleus) + ")")
    elif at["stablehlo.exponential"]:
        parts.append("a softmax (" + ", ".join(at["stablehlo.exponential"]) + ")")
    elif masks := _masks_by_row_statistic(ops, vocab):
        parts.append("a mask against a row statistic (" + ", ".join(masks) + ")")
    if approximate:
        parts.append("an approximate top-k over the vocabulary (" + ", ".join(approximate) + "; lax.approx_max_k, "
                     "whose candidates on TPU are not the exact top k that a kernel's top-k gives)")
    if searches:
        of_bf16 = "; " + EXCESS_PRECISION_NOTE if _element(logits) != "f32" else ""
        parts.append("a threshold search over the vocabulary (" + ", ".join(searches) + of_bf16 + ")")
    zero_noise = [f"stablehlo.divide at {format_location(o.location)}" for o in ops
                  if o.name == "stablehlo.divide" and constant_scalar(o.operands[1]) == 0.0]
    if zero_noise:  # an exponential race whose noise was lost: torchax's exponential_ under jax.jit gives zeros
        parts.append("a division by the constant 0 (" + ", ".join(zero_noise) + "; a race's noise that is no "
                     "noise, as torchax lowers `torch.empty_like(p).exponential_()` under jax.jit: every draw alike)")
    if branches:
        parts.append("the filters of a branch on traced values (" + ", ".join(branches) + ")")
    return parts
