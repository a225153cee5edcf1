"""The sampling pass's templates: what hlofuse-fuse-sampling assumes of JAX's per-platform lowerings.

A site lowers each form once per class of `LOWERS_LIKE` (cpu; tpu for tpu, cuda and rocm) instead of once per
platform. That holds only while JAX lowers every form and writing to the same text for the platforms of a
class; this test lowers each of them for every platform and compares. If it fails after a JAX upgrade, give
the platform that differs its own class.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import pytest
from hlofuse.passes import fuse_sampling
from hlofuse.passes.fuse_sampling import (
    _LOWERING_CLASSES,
    LOWERS_LIKE,
    PLATFORM_VARIANT_OPS,
    PLATFORMS,
    _prelude_text,
    _template_text,
)
from jaxlib.mlir import ir

from hlofuse.ir.context import make_context
from hlofuse.kernels.sampling_reference import FORMS, PRELUDES
from hlofuse.pipeline import run_pipeline
from hlofuse.testing import clone_module
from hlofuse.testing.modules import main_func

# A form drawn by a draw of DRAWS (`<base>_<draw>`) is written as its base's writing followed by the draw's, and
# JAX lowers op by op, so its writings lower alike where their parts do. The parts: every writing of each form with
# its own draw; each draw's writings after every writing of the first base drawn by it; and every other drawn
# form's own function (its filters before its draw). Lowering each drawn writing too, four platforms each, took
# 666 s of test time (1425 cases; 387 now) for no op the parts do not have.
FIRST_BASE = {form.drawn_by: form.base for form in reversed(FORMS.values()) if form.base and not form.prelude_of}
WRITINGS = [(name, i) for name, form in FORMS.items() for i, w in enumerate(form.writings)
            if not w.unit_dims and not form.prelude_of  # (a prelude form has no template: `_prelude_text`'s)
            and (not form.base or FIRST_BASE[form.drawn_by] == form.base or i == 0)]


def _template(name: str, writing: int, platform: str) -> tuple[str, frozenset[str]]:
    """The writing's template for (2, 16) f32 logits (k = 3 where the form has a k), and its ops' names."""
    return _template_text(name, writing, (2, 16), "f32", 3 if "k" in FORMS[name].params else 0, platform)


def _text(name: str, writing: int, platform: str) -> str:
    """The template's ops, without locations (the matcher reads ops and attributes; locations name the parts of
    a form in remarks, and come from the same reference functions)."""
    try:
        text = _template(name, writing, platform)[0]
    except ValueError as error:  # the writing does not take these shapes (a one-row writing of a (B, V) form): no
        return f"no template: {error}"  # template on any platform, as the pass finds (Templates.for_site)
    return _without_locations(text)


def _without_locations(text: str) -> str:
    """The text's ops alone: no location on an op, no location alias, no blank line (how many aliases JAX writes
    depends on what the process traced before, and a text may come from another process: hlofuse.template_cache)."""
    # (a location may nest a call site or an alias, and block arguments carry theirs mid-line)
    text = re.sub(r"^#loc.*$", "", text, flags=re.MULTILINE)
    text = re.sub(r' loc\((?:[^()"]|"[^"]*"|\((?:[^()"]|"[^"]*")*\))*\)', "", text)
    return "\n".join(line for line in text.splitlines() if line.strip())


def _names(name: str, writing: int, platform: str) -> frozenset[str]:
    """The names of the template's ops (none where the writing takes no (2, 16) logits)."""
    try:
        return _template(name, writing, platform)[1]
    except ValueError:
        return frozenset()


@pytest.mark.parametrize(("name", "writing"), WRITINGS, ids=[f"{n}-{i}" for n, i in WRITINGS])
def test_platforms_of_a_class_lower_alike(name: str, writing: int) -> None:
    for platform in PLATFORMS:
        if LOWERS_LIKE[platform] != platform:
            assert _text(name, writing, platform) == _text(name, writing, LOWERS_LIKE[platform]), platform
    # Templates.for_site lowers no other class of a writing that lacks an op outside PLATFORM_VARIANT_OPS
    ops = [_names(name, writing, platform) for platform in _LOWERING_CLASSES]
    assert all(a ^ b <= PLATFORM_VARIANT_OPS for a in ops for b in ops), _LOWERING_CLASSES
    # nor any class of one whose jaxpr implies an op the program lacks: every class's template holds those ops
    for shape in ((2, 16), (1, 16)):
        try:
            required = fuse_sampling._required_ops(name, writing, shape, "f32", 3 if "k" in FORMS[name].params else 0)
        except ValueError:
            continue
        for platform in _LOWERING_CLASSES:
            held = _template_text(name, writing, shape, "f32", 3 if "k" in FORMS[name].params else 0, platform)[1]
            assert required <= held, (shape, platform, sorted(required - held))


def test_the_classes_differ_where_threefry_does() -> None:
    """The classes are not one: the CPU's threefry loop is not the unrolled rounds (else drop a class)."""
    assert _text("temperature", 0, "cpu") != _text("temperature", 0, "tpu")
    assert set(LOWERS_LIKE) == set(PLATFORMS)


@pytest.mark.parametrize("prelude", sorted(PRELUDES))
def test_a_prelude_lowers_alike_on_every_platform(prelude: str) -> None:
    """The normalizations in front of a sampler are lowered once, for the CPU, and matched for every platform."""
    texts = {platform: _without_locations(_prelude_text(prelude, (2, 16), "f32", platform)) for platform in PLATFORMS}
    assert len(set(texts.values())) == 1, texts


def _counting_lowerings(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The platform of each template the pass lowers from now on, in order."""
    lowered: list[str] = []

    def counted(*args: object) -> tuple[str, frozenset[str]]:
        lowered.append(str(args[5]))
        return _template_text(*args)

    monkeypatch.setattr(fuse_sampling, "_template_text", counted)
    return lowered


def test_a_site_lowers_no_other_class_of_a_writing_that_lacks_a_shared_op(monkeypatch: pytest.MonkeyPatch) -> None:
    lowered = _counting_lowerings(monkeypatch)
    templates = fuse_sampling.Templates(make_context(), [])
    cpu_ops, tpu_ops = _names("temperature", 0, "cpu"), _names("temperature", 0, "tpu")
    assert "stablehlo.while" in cpu_ops - tpu_ops
    # a program lowered for the TPU (no threefry loop): the CPU's template lacks only its loop, the TPU's matches
    assert [t.platform for t in templates.for_site(FORMS["temperature"], 0, (2, 16), "f32", 0, set(tpu_ops))] == ["tpu"]
    assert lowered == ["cpu", "tpu"]
    # a program without the log every class's template has (the Gumbel noise's): one class is lowered, none matches
    lowered.clear()
    templates.missing.clear()
    assert "stablehlo.log" in cpu_ops & tpu_ops
    lacking = cpu_ops - {"stablehlo.log"}
    assert list(templates.for_site(FORMS["temperature"], 0, (2, 16), "f32", 0, lacking)) == []
    assert lowered == ["cpu"]
    assert templates.missing["temperature"] == {"stablehlo.log"}


def test_a_site_lowers_no_writing_whose_jaxpr_implies_an_op_the_program_lacks(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Hugging Face's TopP sorts the row and scatters it back: in a program without a sort, its jaxpr says so and
    no platform's template is lowered; an unfused site lowers it after all to name what it lacks."""
    lowered = _counting_lowerings(monkeypatch)
    templates = fuse_sampling.Templates(make_context(), [])
    name = "top_p_ascending_mask"
    held = _names(name, 0, "cpu")
    assert "stablehlo.sort" in fuse_sampling._required_ops(name, 0, (2, 16), "f32", 0)
    lowered.clear()
    lacking = set(held - {"stablehlo.sort"})
    assert list(templates.for_site(FORMS[name], 0, (2, 16), "f32", 0, lacking)) == []
    assert lowered == [] and templates.skipped and name not in templates.missing
    # lowered all the same for a remark (an unfused site's), it names the op
    assert list(templates.for_site(FORMS[name], 0, (2, 16), "f32", 0, lacking, skip_implied=False)) == []
    assert lowered == ["cpu"] and templates.missing[name] == {"stablehlo.sort"}
    lowered.clear()
    # with every op present, it is lowered and matches as before
    assert [t.platform for t in templates.for_site(FORMS[name], 0, (2, 16), "f32", 0, set(held))][0] == "cpu"
    assert lowered[0] == "cpu"


def _draw_operand(fn, platform: str) -> tuple[ir.Module, ir.Value]:  # noqa: ANN001
    """The operand of the first draw (argmax) of `fn` lowered for `platform` and prepared, with its module (which
    must outlive the value)."""
    args = (jax.ShapeDtypeStruct((2, 16), jnp.float32), jax.ShapeDtypeStruct((2,), jnp.uint32))
    module = clone_module(jax.jit(fn).trace(*args).lower(lowering_platforms=(platform,)).compiler_ir("stablehlo"))
    run_pipeline(module, "builtin.module(hlofuse-prepare)")
    draws: list[fuse_sampling.Draw] = []

    def visit(op: ir.Operation) -> ir.WalkResult:
        if (draw := fuse_sampling._draw(op)) is not None:
            draws.append(draw)
        return ir.WalkResult.ADVANCE

    main_func(module).walk(visit)
    return module, draws[0].op.operands[0]


@pytest.mark.parametrize("platform", PLATFORMS)
def test_a_draw_knows_the_class_its_noise_was_lowered_for(platform: str) -> None:
    """A site lowers a stochastic form for its noise's class only: the CPU's threefry loop is found in the program
    (its rotation amounts), and noise without it is the unrolled rounds of the other class."""
    _, noisy = _draw_operand(lambda x, key: jax.random.categorical(key, x / 0.7), platform)
    assert fuse_sampling._noise_class(noisy) == LOWERS_LIKE[platform]
    # in a decode loop's body, the key carried (as Flax's lm1b and T5X draw)
    _, looped = _draw_operand(lambda x, key: jax.lax.fori_loop(
        0, 2, lambda i, c: jax.random.categorical(jax.random.fold_in(key, i), x + c[:, None]), jnp.zeros(2, jnp.int32)),
        platform)
    assert fuse_sampling._noise_class(looped) == LOWERS_LIKE[platform]
    _, greedy = _draw_operand(lambda x, key: jnp.argmax(x, -1), platform)
    assert fuse_sampling._noise_class(greedy) is None


def test_a_site_lowers_a_stochastic_form_for_its_noise_class_only(monkeypatch: pytest.MonkeyPatch) -> None:
    lowered = _counting_lowerings(monkeypatch)
    templates = fuse_sampling.Templates(make_context(), [])
    both = set(_names("temperature", 0, "cpu") | _names("temperature", 0, "tpu"))
    lowered.clear()
    # the site's noise is the unrolled rounds: the CPU's template (tried first, as the last fused) is not lowered
    found = [t.platform for t in templates.for_site(FORMS["temperature"], 0, (2, 16), "f32", 0, both,
                                                   noise_class="tpu")]
    assert found == ["tpu"] and lowered == ["tpu"]


def test_a_run_starts_from_the_cpu_whatever_another_run_fused(monkeypatch: pytest.MonkeyPatch) -> None:
    """The platform hint (the last fused site's, lowered first) is the run's own state: after a run fused a program
    lowered for the TPU, another run over a CPU program lowers the CPU's template first (no state is shared between
    runs, which may be concurrent compiles)."""
    def lowered_for(fn, platform: str) -> ir.Module:  # noqa: ANN001
        args = (jax.ShapeDtypeStruct((2, 16), jnp.float32), jax.ShapeDtypeStruct((2,), jnp.uint32))
        return clone_module(jax.jit(fn).trace(*args).lower(lowering_platforms=(platform,)).compiler_ir("stablehlo"))

    fuse = "builtin.module(hlofuse-prepare,hlofuse-fuse-sampling)"
    tpu_program = lowered_for(lambda x, key: jax.random.categorical(key, x / 0.7), "tpu")
    assert run_pipeline(tpu_program, fuse).counters["temperature_to_sample"] == 1
    lowered = _counting_lowerings(monkeypatch)
    cpu_program = lowered_for(lambda x, key: jnp.argmax(jax.nn.softmax(x, axis=-1), axis=-1), "cpu")
    assert run_pipeline(cpu_program, fuse).counters["greedy_softmax_to_sample"] == 1
    assert lowered[0] == "cpu", lowered
