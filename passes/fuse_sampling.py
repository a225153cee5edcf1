"""hlofuse-fuse-sampling: raises token sampling to `stablehlo.composite "hlofuse.sample"`.

Anchors on every argmax over the last axis (JAX's variadic `reduce` of (values, iota)). For each, it
tries the sampler forms of hlofuse.kernels.sampling_reference.FORMS (greedy, argmax of a softmax,
temperature + categorical, top-k by `lax.top_k` (or a stable argsort sliced to k) in rank space or as a
mask, nucleus top-p by sort + softmax + cumsum + threshold, min-p, top-k then top-p): each form is lowered
for the site's logits
shape, dtype and k, with sentinel constants for temperature, p and min-p, and the site is fused only if
the program computes, op for op, that lowering (hlofuse.ir.template_match). The Gumbel noise therefore
comes from the same threefry2x32 counters as in JAX, and the composite's attributes plus its form
reproduce the program's token ids exactly.

    %t = <sort, softmax, cumsum, select, threefry, log, argmax...>(%logits, %key)
  becomes
    %t = stablehlo.composite "hlofuse.sample" %logits, %key {composite_attributes = {form = "top_p_mask",
         k = 0 : i64, min_p = 0.0 : f64, mode = "top_p", p = 0.9 : f64, temperature = 0.7 : f64},
         decomposition = @hlofuse.sample.impl, version = 1 : i32}

Sites whose interior values have users outside them are left alone, and an argmax over
Gumbel-perturbed logits that no form matches gets a remark (a near-miss). So does an argsort sliced to k
that is not a top-k writing when the draw after it fuses as the temperature fallback.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import ClassVar

import jax
import jax.numpy as jnp
from jaxlib.mlir import ir

from hlofuse.composites import SAMPLE, SAMPLE_VERSION, SampleAttrs
from hlofuse.ir import build
from hlofuse.ir.match import defining_op
from hlofuse.ir.template_match import TemplateMatch, match_template
from hlofuse.kernels.sampling_reference import FORMS, Form
from hlofuse.pipeline import ModulePass, PassState

# Parameter values no program writes: the template's constants that stand for the site's parameters.
SENTINELS = {"temperature": 1.2345678, "p": 0.87654321, "min_p": 0.0456789}
THREEFRY_KS_PARITY = 0x1BD11BDA  # threefry2x32's key-schedule constant: noise is in the slice
_DTYPES = {"f32": jnp.float32, "bf16": jnp.bfloat16, "f16": jnp.float16}
_SEARCH_FORWARD = 12  # ops between the argmax and the token ids (take_along_axis, reshapes)


class NoMatch(Exception):
    """An argmax that is not fused; the message is the remark."""


# ----- anchors -------------------------------------------------------------------------------------


def _is_argmax(op: ir.Operation) -> bool:
    """reduce((x, iota), (init, 0)) over x's last dim, as jnp.argmax lowers."""
    if op.name != "stablehlo.reduce" or len(op.operands) != 4 or len(op.results) != 2:
        return False
    dims = list(ir.DenseI64ArrayAttr(op.attributes["dimensions"]))
    x_type = ir.RankedTensorType(op.operands[0].type)
    iota = defining_op(op.operands[1])
    if len(dims) != 1 or dims[0] != x_type.rank - 1 or iota is None or iota.name != "stablehlo.iota":
        return False
    return isinstance(x_type.element_type, ir.FloatType)


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
    for op in _backward_ops(value):
        if op.name == "stablehlo.constant":
            attr = op.attributes["value"]
            if isinstance(attr, ir.DenseElementsAttr) and attr.is_splat and "ui32" in str(attr.type):
                if ir.IntegerAttr(attr.get_splat_value()).value == THREEFRY_KS_PARITY:
                    return True
    return False


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
_last_platform = ["cpu"]  # the platform of the last site fused (a hint for the order only; races are harmless)
_OP_NAME = re.compile(r'(?:^|= )"?((?:stablehlo|chlo)\.\w+)', re.MULTILINE)


@functools.lru_cache(maxsize=256)
def _traced(form_name: str, writing: int, shape: tuple[int, ...], dtype: str, k: int) -> jax.stages.Traced:
    """The form's `writing` traced for these logits, with sentinel parameters (one trace for every platform)."""
    form = FORMS[form_name]
    fn = functools.partial(form.writings[writing].fn, temperature=SENTINELS["temperature"], k=k, p=SENTINELS["p"],
                           min_p=SENTINELS["min_p"])
    return jax.jit(fn).trace(jax.ShapeDtypeStruct(shape, _DTYPES[dtype]), jax.ShapeDtypeStruct((2,), jnp.uint32))


@functools.lru_cache(maxsize=1024)
def _template_text(form_name: str, writing: int, shape: tuple[int, ...], dtype: str, k: int,
                   platform: str) -> tuple[str, frozenset[str]]:
    """The form's `writing` lowered for `platform` after hlofuse-prepare, and the names of its ops."""
    from hlofuse.pipeline import run_pipeline

    lowered = _traced(form_name, writing, shape, dtype, k).lower(lowering_platforms=(platform,))
    module = lowered.compiler_ir("stablehlo")
    module = ir.Module.parse(module.operation.get_asm(binary=True), context=module.context)
    run_pipeline(module, "builtin.module(hlofuse-prepare)")
    text = str(module)
    return text, frozenset(_OP_NAME.findall(text))


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

    def for_site(self, form: Form, writing: int, shape: tuple[int, ...], dtype: str, k: int,
                 ops_present: set[str]) -> Iterator[Template]:
        """The form's distinct lowerings over PLATFORMS (the last matched platform first) whose ops all occur
        in the program."""
        order = [_last_platform[0], *(p for p in PLATFORMS if p != _last_platform[0])]
        seen: set[str] = set()
        for platform in order:
            text, names = _template_text(form.name, writing, shape, dtype, k, platform)
            if text in seen or not names <= ops_present:
                continue
            seen.add(text)
            root, args = self._parse(text)
            yield Template(root, args if form.stochastic else args[:1], platform)

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

    def attrs(self) -> SampleAttrs:
        params = self.match.params
        return SampleAttrs(mode=self.form.mode, form=self.form.name,
                           temperature=params.get("temperature", 1.0), k=self.k,
                           p=params.get("p", 1.0), min_p=params.get("min_p", 0.0))


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


def _candidates(argmax: ir.Operation, noisy: bool, top_ks: list[TopK],
                ops_present: set[str]) -> Iterator[tuple[Form, int, tuple[int, ...], str, int]]:
    """(form, writing, logits shape, dtype, k) worth lowering for this argmax."""
    x = argmax.operands[0]
    shape, dtype = _shape(x), _element(x)
    writings = [(form, i, w.marker_ops) for form in FORMS.values() for i, w in enumerate(form.writings)]
    for form, writing, markers in sorted(writings, key=lambda c: (-len(c[2]), -len(c[0].params))):
        if form.stochastic != noisy or not set(markers) <= ops_present:
            continue
        if "k" not in form.params:
            yield form, writing, shape, dtype, 0
            continue
        for top_k in dict.fromkeys(top_ks):
            if form.name in ("top_k", "temperature_top_k") and shape[-1] == top_k.k:
                yield form, writing, top_k.shape, top_k.dtype, top_k.k
            elif top_k.shape == shape and top_k.dtype == dtype and top_k.k < shape[-1]:
                yield form, writing, shape, dtype, top_k.k


def analyze(argmax: ir.Operation, top_ks: list[TopK], ops_present: set[str], templates: Templates) -> Site:
    noisy = _has_noise(argmax.operands[0])
    tried: list[str] = []
    for form, writing, shape, dtype, k in _candidates(argmax, noisy, top_ks, ops_present):
        if dtype not in _DTYPES:
            continue
        if form.name not in tried:
            tried.append(form.name)
        for template in templates.for_site(form, writing, shape, dtype, k, ops_present):
            root_name = defining_op(template.root).name
            for root in _forward_values(argmax.results[1], _SEARCH_FORWARD):
                op = defining_op(root)
                if op is None or op.name != root_name or str(root.type) != str(template.root.type):
                    continue
                found = match_template(root, template.root, template.args, SENTINELS)
                if found is not None:
                    _last_platform[0] = template.platform
                    return Site(form, root, found, k)
    what = "Gumbel-perturbed logits" if noisy else "logits"
    raise NoMatch(f"argmax over {what} matches no sampler form (tried: {', '.join(tried) or 'none'})")


# ----- the rewrite ---------------------------------------------------------------------------------


def _interior(site: Site) -> set[ir.Operation]:
    return set(site.match.ops.values())


# A softmax's row statistics over the logits (the max, the shifted logits, their exp, its sum): after
# hlofuse-prepare's CSE a log-softmax of the same logits (logprobs) computes them with the sampler's own
# ops. They may be shared: the decomposition recomputes its copies and the originals stay for the other
# users, which costs what the unfused program already spends on them. The sampler's stages (the
# probabilities, the scaled logits, the cumulative mass, the noise) may not.
_ROW_STATISTICS = ("stablehlo.reduce", "stablehlo.subtract", "stablehlo.exponential", "stablehlo.broadcast_in_dim")


def _check_escapes(site: Site, interior: set[ir.Operation]) -> None:
    """Values the sampler computes from its operands (logits, key) may not be used outside it, except the
    row statistics of the logits alone (above). Values built from constants and iotas alone (JAX lowers one
    broadcast of -inf or one iota for several users) may be shared: the decomposition gets its own clones,
    and the originals stay for their other users."""
    leaves = site.match.leaves
    tainted: set[ir.Value] = set(leaves.values())
    keyed: set[ir.Value] = {leaves[i] for i in leaves if i > 0}  # leaf 0 is the logits, 1 the key
    block = defining_op(site.root).parent.regions[0].blocks[0]
    for op in (o.operation for o in block.operations):
        if op not in interior or not any(v in tainted for v in op.operands):
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
                raise NoMatch(f"{op.name} inside the sampler has a user outside it ({user.name})")


def _inside(op: ir.Operation, interior: set[ir.Operation]) -> bool:
    while True:
        if op in interior:
            return True
        parent = op.parent
        if parent is None or parent.name == "func.func":
            return False
        op = parent.operation


def rewrite(site: Site, module: ir.Operation) -> ir.Operation:
    """Outlines the matched ops into @hlofuse.sample.impl and calls it through the composite."""
    interior = _interior(site)
    _check_escapes(site, interior)
    leaves = [site.match.leaves[i] for i in sorted(site.match.leaves)]
    root_op = defining_op(site.root)
    block = root_op.parent.regions[0].blocks[0]
    ordered = [op.operation for op in block.operations if op.operation in interior]

    def body(args: list[ir.Value]) -> list[ir.Value]:
        mapping = dict(zip(leaves, args, strict=True))
        for op in ordered:
            clone = op.clone()
            _remap(clone, mapping)
            for old, new in zip(op.results, clone.results, strict=True):
                mapping[old] = new
        return [mapping[site.root]]

    location = root_op.location
    name = build.unique_symbol(module, f"{SAMPLE}.impl")
    name = build.build_private_func(module, name, [v.type for v in leaves], body, location)
    with location, ir.InsertionPoint(root_op):
        attributes = site.attrs().ir_attributes()
        op = build.composite(SAMPLE, leaves, [site.root.type], attributes, name, SAMPLE_VERSION)
    # The composite must come after its operands: right before the root, which follows them all.
    site.root.replace_all_uses_with(op.results[0])
    leaf_ops = [o for o in ordered if o.name in build.LEAF_OPS]
    build.erase_dead([o for o in ordered if o.name not in build.LEAF_OPS])
    build.erase_dead(leaf_ops)
    return op


def _remap(op: ir.Operation, mapping: dict[ir.Value, ir.Value]) -> None:
    """Rewires `op`'s operands, and those of every op nested in its regions, through `mapping`."""

    def visit(nested: ir.Operation) -> ir.WalkResult:
        for index, operand in enumerate(nested.operands):
            if operand in mapping:
                nested.operands[index] = mapping[operand]
        return ir.WalkResult.ADVANCE

    op.walk(visit)


def _sites(module: ir.Operation) -> Iterator[tuple[ir.Operation, list[TopK], set[str]]]:
    for fn in build.functions(module, skip_decompositions=True):
        argmaxes: list[ir.Operation] = []
        top_ks: list[TopK] = []
        names: set[str] = set()

        def visit(op: ir.Operation, argmaxes: list[ir.Operation] = argmaxes, top_ks: list[TopK] = top_ks,
                  names: set[str] = names) -> ir.WalkResult:
            names.add(op.name)
            if _is_argmax(op):
                argmaxes.append(op)
            else:
                top_ks.extend(_top_ks(op))
            return ir.WalkResult.ADVANCE

        fn.walk(visit)
        for argmax in argmaxes:
            yield argmax, top_ks, names


@dataclass(frozen=True)
class FuseSamplingPass(ModulePass):
    """Raises each token sampler (argmax of possibly filtered, Gumbel-perturbed logits) to
    `stablehlo.composite "hlofuse.sample"` (see module docs)."""

    name: ClassVar[str] = "hlofuse-fuse-sampling"
    summary: ClassVar[str] = "Raise greedy/temperature/top-k/top-p/min-p samplers to hlofuse.sample composites"

    def run(self, module: ir.Operation, state: PassState) -> None:
        failed: set[ir.Operation] = set()  # never erased, so these handles stay valid
        templates = Templates(module.context, state.keep_alive)
        while self._fuse_one(module, state, failed, templates):
            pass  # each rewrite erases ops: collect the sites afresh

    def _fuse_one(self, module: ir.Operation, state: PassState, failed: set[ir.Operation],
                  templates: Templates) -> bool:
        for argmax, top_ks, names in list(_sites(module)):
            if argmax in failed:
                continue
            try:
                site = analyze(argmax, top_ks, names, templates)
                near_misses = _argsorts_not_fused(site, top_ks)
                rewrite(site, module)
            except NoMatch as reason:
                failed.add(argmax)
                if "Gumbel" in str(reason) or "outside" in str(reason):
                    state.remark(argmax, f"sampler not fused: {reason}")
                    state.count("sampling_not_fused")
                continue
            state.count(f"{site.form.name}_to_sample")
            for sort in near_misses:
                state.remark(sort, f"top-k by argsort not fused into the sampler (fused as `{site.form.name}` "
                             "after it): only a stable descending argsort sliced to k, jnp.argsort(x, "
                             "descending=True, stable=True)[..., :k], orders as lax.top_k (argsort(-x) puts NaN "
                             "last; a reversed ascending argsort puts a tie's higher id first)")
                state.count("argsort_top_k_not_fused")
            return True
        return False


_FALLBACK_FORMS = ("temperature", "categorical")  # what a filter written another way fuses as


def _argsorts_not_fused(site: Site, top_ks: list[TopK]) -> list[ir.Operation]:
    """The argsort sorts that feed a site fused as a fallback form: top-k writings that were not one."""
    if site.form.name not in _FALLBACK_FORMS:
        return []
    sorts = {top_k.sort for top_k in top_ks if top_k.sort is not None}
    upstream = {op for leaf in site.match.leaves.values() for op in _backward_ops(leaf)}
    return [sort for sort in sorts if sort in upstream]
