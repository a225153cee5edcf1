"""The `hlofuse.sample` composite: its name, version and attributes (docs/composites.md).

`SampleAttrs` reads the attributes back from IR. Its `form` names one of the sampler forms of
hlofuse.kernels.sampling_reference (`FORMS`), which fix what each parameter means, so this module reads them
from there: the forms are part of the contract (the composite's reference is the form's function).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from jaxlib.mlir import ir

from hlofuse.kernels.sampling_reference import FORMS, Stage, form_params
from hlofuse.ops.attributes import attribute_values

SAMPLE = "hlofuse.sample"
SAMPLE_VERSION = 1


@dataclass(frozen=True)
class SampleAttrs:
    """Attributes of `hlofuse.sample` v1. Operands: logits (..., V) float, key (2,) uint32 (threefry2x32), or (B, 2)
    for a form that draws each row with its own key (`Form.row_keys`), then the (B,) per-row parameters of a form
    that has them (`Form.row_params`, in its order). The result is the token id per row, int32, of shape
    logits.shape[:-1]; with `scores`, then the scores its draw perturbs, shaped and typed as the logits.

    `form` names the sampler as written (hlofuse.kernels.sampling_reference.FORMS): it fixes the order of
    temperature and filters, where the Gumbel noise is indexed (vocabulary id or rank) and the tie rules.
    """

    mode: str  # greedy | temperature | top_k | top_p | min_p | top_k+top_p | epsilon | typical (these two also top_k+)
    form: str
    temperature: float = 1.0
    k: int = 0  # 0 = no top-k
    p: float = 1.0  # 1 = no top-p
    min_p: float = 0.0  # 0 = no min-p
    eps: float = 0.0  # the floor added to probabilities before their log (forms that read it); 0 = none
    epsilon: float = 0.0  # the absolute probability below which a token is removed (epsilon sampling); 0 = none
    # A second result: the scores the form's draw perturbs (its filtered logits, the dropped ones at `fill`), which
    # the program also reads (T5X's log-probability of the drawn token); forms that `gives_scores` only.
    scores: bool = False
    fill: float = float("-inf")  # with `scores`: the value of the dropped logits in them
    # The f32 Gumbel noise where the uniform is 0, for a categorical whose noise is written by hand (-log(-log(u +
    # eps) + eps) and the like, hlofuse.kernels.noise.HAND_NOISES): JAX's noise at every other uniform. None: JAX's
    # own noise everywhere. (f32 logits only; their categorical is `noise.categorical_at_zero`.)
    gumbel_at_zero: float | None = None
    # The filters in front of the form, in the order the program applies them (sampling_reference.Stage): a chain's
    # earlier filters, each `{form, writing, <its parameters>}`; () for none.
    stages: tuple[Stage, ...] = ()

    @staticmethod
    def from_ir(attributes: ir.Attribute) -> SampleAttrs:
        """The attributes of a composite's `composite_attributes` dictionary."""
        return SampleAttrs.from_dict(attribute_values(attributes))

    @staticmethod
    def from_dict(attributes: dict[str, Any]) -> SampleAttrs:
        """The attributes of a `CompositeCall`; raises ValueError naming any this version does not have."""
        known = {f.name for f in dataclasses.fields(SampleAttrs)}
        unknown = set(attributes) - known
        if unknown:
            raise ValueError(f"unknown hlofuse.sample attributes {sorted(unknown)}")
        stages = tuple(_stage(stage) for stage in attributes.get("stages", ()))
        return SampleAttrs(**{**attributes, "stages": stages})

    def ir_attributes(self) -> dict[str, ir.Attribute]:
        """The composite_attributes dictionary (call inside an MLIR context)."""
        f64, i64 = ir.F64Type.get(), ir.IntegerType.get_signless(64)
        attributes = {"mode": ir.StringAttr.get(self.mode), "form": ir.StringAttr.get(self.form),
                      "temperature": ir.FloatAttr.get(f64, self.temperature), "k": ir.IntegerAttr.get(i64, self.k),
                      "p": ir.FloatAttr.get(f64, self.p), "min_p": ir.FloatAttr.get(f64, self.min_p)}
        if self.eps:  # only forms that read a floor carry one, so that every other composite reads as before
            attributes["eps"] = ir.FloatAttr.get(f64, self.eps)
        if self.epsilon:  # likewise, only epsilon sampling's forms
            attributes["epsilon"] = ir.FloatAttr.get(f64, self.epsilon)
        if self.scores:  # likewise, only composites that give back their scores
            attributes["scores"] = ir.BoolAttr.get(True)
            attributes["fill"] = ir.FloatAttr.get(f64, self.fill)
        if self.gumbel_at_zero is not None:  # likewise, only a categorical whose noise is written by hand
            attributes["gumbel_at_zero"] = ir.FloatAttr.get(f64, self.gumbel_at_zero)
        if self.stages:  # likewise, only a chain with filters in front of its form
            attributes["stages"] = ir.ArrayAttr.get([_stage_attribute(stage) for stage in self.stages])
        return attributes

    def params(self) -> dict[str, Any]:
        """Keyword arguments of the form's function (hlofuse.kernels.sampling_reference): the parameters
        the form reads, the others at their neutral values (`form_params`)."""
        values = {"temperature": self.temperature, "k": self.k, "p": self.p, "min_p": self.min_p, "eps": self.eps,
                  "epsilon": self.epsilon}
        return form_params(self.form, **values) if self.form in FORMS else values


def _stage(values: Stage | dict[str, Any]) -> Stage:
    """A stage from its attribute dictionary (`{form, writing, <parameters>}`); a Stage as it is."""
    if isinstance(values, Stage):
        return values
    params = {name: value for name, value in values.items() if name not in ("form", "writing")}
    return Stage(str(values["form"]), int(values["writing"]), tuple(sorted(params.items())))


def _stage_attribute(stage: Stage) -> ir.Attribute:
    """A stage's attribute dictionary: k as i64, the other parameters as f64."""
    f64, i64 = ir.F64Type.get(), ir.IntegerType.get_signless(64)
    attributes = {"form": ir.StringAttr.get(stage.form), "writing": ir.IntegerAttr.get(i64, stage.writing)}
    for name, value in stage.params:
        attributes[name] = ir.IntegerAttr.get(i64, int(value)) if name == "k" else ir.FloatAttr.get(f64, value)
    return ir.DictAttr.get(attributes)


__all__ = ["SAMPLE", "SAMPLE_VERSION", "SampleAttrs"]
