"""A nucleus whose cut the f32 rounding of the program's cumsum decides, shared by the CPU, Pallas and NKI sampler
tests: p is the exact mass of the top 1147 of 4096 logits (1.5 N(0, 1)), where the program's f32 cumsum rounds
below p, so the program keeps one token more than exact arithmetic does; at T = 5 that token (id 215) is what row
ROW of a batch draws with KEY. A kernel that decides the cut by its own arithmetic draws another (the CPU's, by f64
mass: 2637; the NKI kernel's, by f32 mass: 2637)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from hlofuse.kernels.noise import categorical_at_rows
from hlofuse.kernels.sampling_reference import sample_reference

ROW = 368
KEY = (0, 1)
TEMPERATURE = 5.0
PROGRAM_TOKEN = 215


def rounded_cut() -> tuple[jax.Array, float]:
    """(1, 4096) f32 logits and the p of their nucleus, checked to be one the program's rounding decides."""
    x = (np.random.default_rng(0).standard_normal((1, 4096)) * 1.5).astype(np.float32)
    ordered = np.sort(x[0])[::-1].astype(np.float64)
    mass = np.exp(ordered - ordered.max())
    exact = np.cumsum(mass / mass.sum())
    p = float(np.float32(exact[1146]))
    program = jax.jit(lambda x: jnp.cumsum(jax.nn.softmax(jnp.sort(x)[..., ::-1], axis=-1), axis=-1))(x)
    assert int(jnp.sum(program < p)) == 1147 and int(np.sum(exact.astype(np.float32) < p)) == 1146
    return jnp.asarray(x), p


def program_token(x: jax.Array, p: float) -> int:
    """The program's token for row ROW of a batch of such rows (the noise of that row)."""
    ids = sample_reference(x, jnp.asarray(KEY, jnp.uint32), form="top_p_mask", temperature=TEMPERATURE, p=p,
                           categorical_fn=categorical_at_rows(ROW))
    assert int(ids[0]) == PROGRAM_TOKEN
    return PROGRAM_TOKEN
