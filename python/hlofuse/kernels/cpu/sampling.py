"""Token sampling on the CPU: the `hlofuse_sample` XLA FFI kernel (sampling.cc) and its binding.

`sample` returns the token ids of `sample_reference` (the composite's contract) for the forms it
supports, without sorting the vocabulary: one pass for the row max (and the softmax sum where a filter
needs probabilities), a pivot search for the top-k / top-p / min-p threshold over the few candidates
that can pass it, then Gumbel noise from threefry2x32 computed only at the counters of the surviving
tokens. Rows run in parallel, and a row's vocabulary is split across threads when rows are few.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np

from hlofuse.kernels.sampling_reference import sample_reference

if TYPE_CHECKING:
    from hlofuse.kernels import CompositeCall

TARGET = "hlofuse_sample"
# form -> the kernel's form code (sampling.cc: enum class Form).
FORM_CODES = {"greedy": 0, "categorical": 1, "temperature": 1, "top_k": 2,
              "temperature_top_k": 3, "top_k_mask": 4, "top_p_mask": 5, "top_k_top_p_mask": 6, "min_p": 7}

# Forms whose filter compares probabilities: the program rounds them (and their cumulative sum) to bf16.
BF16_UNSUPPORTED = ("top_p_mask", "top_k_top_p_mask", "min_p")


def is_available() -> bool:
    """True when the native library is built and exports the sampling kernel."""
    from hlofuse.kernels import cpu

    if not cpu.is_available():
        return False
    try:
        return bool(getattr(cpu._load(), TARGET))
    except AttributeError:
        return False


def isa() -> str:
    """The vector ISA the sampler picks here: "avx512", "avx2" or "generic" ($HLOFUSE_CPU_ISA lowers it)."""
    from hlofuse.kernels import cpu

    fn = cpu._load().hlofuse_sample_isa
    fn.restype = ctypes.c_char_p
    return str(fn().decode())


def noise_stats() -> tuple[int, int]:
    """(noise draws, exact noise evaluations) over all rows since the last call: what the Gumbel bound left."""
    from hlofuse.kernels import cpu

    draws, logs = ctypes.c_int64(0), ctypes.c_int64(0)
    cpu._load().hlofuse_sample_stats(ctypes.byref(draws), ctypes.byref(logs))
    return draws.value, logs.value


def sample(
    logits: jax.Array,  # (..., V) f32 or bf16
    key: jax.Array | None,  # (2,) uint32
    *,
    form: str,
    temperature: float = 1.0,
    k: int = 0,
    p: float = 1.0,
    min_p: float = 0.0,
) -> jax.Array:  # (...,) int32
    """`sample_reference`'s token ids, computed by the native CPU kernel."""
    from hlofuse.kernels import cpu

    if form not in FORM_CODES:
        raise ValueError(f"the CPU sampler has no form '{form}'")
    if logits.dtype not in (jnp.float32, jnp.bfloat16):
        raise ValueError(f"logits must be float32 or bfloat16, got {logits.dtype}")
    cpu.register()
    batch, vocab = logits.shape[:-1], logits.shape[-1]
    rows = int(np.prod(batch, dtype=np.int64))
    if key is None:
        key = jnp.zeros((2,), jnp.uint32)
    out_type = jax.ShapeDtypeStruct((rows,), jnp.int32)
    call = jax.ffi.ffi_call(TARGET, out_type, vmap_method="sequential")
    keys = jnp.broadcast_to(key.astype(jnp.uint32), (rows, 2))
    row_ids = jax.lax.iota(jnp.int32, rows)
    tokens = call(logits.reshape(rows, vocab), keys, row_ids, form=np.int64(FORM_CODES[form]),
                  temperature=np.float32(temperature), k=np.int64(k), p=np.float32(p), min_p=np.float32(min_p))
    return tokens.reshape(batch)


def sampling_lowering(call: CompositeCall) -> Callable[..., Any]:
    """target=cpu: this kernel for an `hlofuse.sample` composite, or Unsupported saying why not."""
    from hlofuse.composites import SampleAttrs
    from hlofuse.kernels import Unsupported

    if not is_available():
        raise Unsupported("the native CPU sampling kernel is not built (pip install . builds it)")
    attrs = SampleAttrs.from_dict(call.attributes)
    if attrs.form not in FORM_CODES:
        raise Unsupported(f"the CPU sampler has no form '{attrs.form}'")
    dtype = call.operand_types[0][1]
    if dtype not in ("f32", "bf16"):
        raise Unsupported(f"the CPU sampler takes f32 or bf16 logits, not {dtype}")
    if dtype == "bf16" and attrs.form in BF16_UNSUPPORTED:
        raise Unsupported(f"'{attrs.form}' on bf16 logits thresholds bf16-rounded probabilities, which the CPU "
                          "sampler does not reproduce")
    if attrs.k > call.operand_types[0][0][-1]:
        raise Unsupported(f"k = {attrs.k} exceeds the vocabulary")

    def kernel(logits: jax.Array, key: jax.Array | None = None) -> jax.Array:
        return sample(logits, key, form=attrs.form, **attrs.params())

    return kernel


__all__ = ["FORM_CODES", "isa", "noise_stats", "sample", "sample_reference", "sampling_lowering"]
