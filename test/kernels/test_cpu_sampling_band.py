"""The certified nucleus cut on the CPU (sampling.cc "Certified nucleus cut", sampling.py "A nucleus drawn by its
band"): a sorted nucleus keeps a token by the program's f32 cumulative mass at its sorted place, which XLA rounds in
an order the kernel does not know. The kernel draws among the tokens at or above the band of values that rounding
can move the cut across and vouches only for a winner above the band; any other row takes the program's own cut.

The logits here are built so that the cut falls where the program's f32 cumsum and the exact mass disagree (p set to
the exact cumulative mass at a sorted place), with ties at the cut (logits on a coarse grid), and at random p."""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import nucleus_rounding
import numpy as np
import pytest

from hlofuse.kernels.cpu import sampling
from hlofuse.kernels.sampling_reference import FORMS, UNCERTIFIED, form_params, masked_top_k, sample_reference

pytestmark = pytest.mark.skipif(not sampling.is_available(), reason="the native CPU sampler is not built")

ROWS, VOCAB = 64, 3000
KINDS = ("exact_cumsum", "coarse_ties", "fine_ties", "random_p")


def _row_and_p(kind: str, seed: int, from_below: bool, k: int = 0) -> tuple[np.ndarray, float]:
    """One row of logits and the mass p its nucleus keeps. exact_cumsum and the ties: p is the exact cumulative mass
    at a sorted place (from the top; from the bottom, 1 - the mass below), where f32 rounding decides the cut; with
    `k`, the mass among the row's k largest (a nucleus after a top-k)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(VOCAB) * rng.choice([1.0, 2.0, 4.0])
    if kind == "coarse_ties":
        x = np.round(x * 4) / 4
    elif kind == "fine_ties":
        x = np.round(x * 64) / 64
    x = x.astype(np.float32)
    if kind == "random_p":
        return x, float(rng.uniform(0.3, 0.99))
    width = k or VOCAB
    ordered = np.sort(x)[VOCAB - width:].astype(np.float64)
    mass = np.exp(ordered - ordered.max())
    cumulative = np.cumsum(mass / mass.sum())
    if from_below:  # the removal threshold 1 - p is an f32 constant in the program
        return x, 1.0 - float(np.float32(cumulative[width - 1 - rng.integers(1, min(40, width - 1))]))
    return x, float(np.float32(1.0 - cumulative[width - 1 - rng.integers(1, min(40, width - 1))]))


def _assert_certified_draws_are_the_programs(form: str, draw_by_band: Callable[..., jax.Array],
                                             lowering: Callable[..., jax.Array], from_below: bool,
                                             top_k: int = 0, more_params: Callable[..., dict] | None = None) -> int:
    """For each kind, rows that are one row rolled along the vocabulary (the same cut; each token meets other noise):
    every token the band certifies is the program's, and so is every token of the lowering. Returns how many rows
    were left to the program's cut. (The choice draw unrolls a jax.random.choice per row: fewer rows.)
    `more_params(row, temperature)`: the form's other parameters, from the row."""
    uncertified = 0
    rows = ROWS // 4 if form.endswith("_choice") else ROWS
    for i, kind in enumerate(KINDS):
        row, p = _row_and_p(kind, 100 * i + len(form), from_below, top_k)
        x = jnp.asarray(np.stack([np.roll(row, 37 * r) for r in range(rows)]))
        temperature = (0.5, 1.0, 3.0)[i % 3]
        more = more_params(row, temperature) if more_params else {}
        params = form_params(form, temperature=temperature, p=p, k=top_k or 30, **more)
        key = jnp.array([i, 7], jnp.uint32)
        ref = np.asarray(jax.jit(lambda x, key, params=params: sample_reference(x, key, form=form, **params))(x, key))
        certified = np.asarray(jax.jit(lambda x, key, params=params: draw_by_band(x, key, params))(x, key))
        drawn = certified != UNCERTIFIED
        np.testing.assert_array_equal(certified[drawn], ref[drawn], err_msg=f"{form}: a certified draw, {kind}")
        np.testing.assert_array_equal(jax.jit(lowering(params))(x, key), ref, err_msg=f"{form}: lowered, {kind}")
        uncertified += int(np.sum(~drawn))
    return uncertified


def _kernel_form(code_form: str) -> Callable[..., jax.Array]:
    """The kernel's own draw for `code_form`, UNCERTIFIED rows as they are (no fallback)."""

    def draw(x: jax.Array, key: jax.Array, params: dict) -> jax.Array:
        rows = x.shape[0]
        (tokens,) = sampling._sample_call(x, jnp.broadcast_to(key, (rows, 2)), jax.lax.iota(jnp.int32, rows),
                                          form=code_form, **{n: params.get(n, 0.0) for n in ("temperature", "p")},
                                          k=params.get("k", 0), min_p=0.0)
        return tokens

    return draw


@pytest.mark.parametrize("form", ["top_p_mask", "top_k_top_p_mask"])
def test_value_cut_draws_are_the_programs(form: str) -> None:
    """JetStream's and MaxText's `x >= sorted[sum(cumsum < p)]` (after a top-k mask): the kernel's form certifies its
    draws, and `sample` gives the program's ids."""
    def lowering(params: dict) -> Callable[..., jax.Array]:
        return lambda x, key: sampling.sample(x, key, form=form, **params)

    _assert_certified_draws_are_the_programs(form, _kernel_form(form), lowering, from_below=False)


@pytest.mark.parametrize("form", ["top_p_mask_choice", "top_p_mask_log_softmax", "top_p_mask_exponential_race",
                                  "top_k_top_p_mask_log_of_softmax", "top_k_top_p_mask_exponential_race"])
def test_value_cut_drawn_forms_are_the_programs(form: str) -> None:
    """JetStream's nucleus under the other draws (`drawn_form_lowering`: BANDED_DRAWN_NUCLEI): the band of the row or
    of its top k, then the draw; the exponential race certified by its winner's lead as a ratio."""
    top_k = 40 if form.startswith("top_k_") else 0
    draw = form.removeprefix("top_k_").removeprefix("top_p_mask_")

    def by_band(x: jax.Array, key: jax.Array, params: dict) -> jax.Array:
        return sampling.nucleus_draw_in_band(draw, x, key, params, top_k or None, from_below=False, by_place=False)

    def lowering(params: dict) -> Callable[..., jax.Array]:
        return sampling.drawn_form_lowering(form, params)

    _assert_certified_draws_are_the_programs(form, by_band, lowering, from_below=False, top_k=top_k)


def _min_p_at_a_token(row: np.ndarray, temperature: float) -> dict:
    """A min-p whose threshold falls on the row's 12th largest token (its probability's ratio to the largest, in f32
    as the program computes y = x / T): rounding decides whether it is removed."""
    y = (row / np.float32(temperature)).astype(np.float32)
    ordered = np.sort(y)[::-1]
    return {"min_p": float(np.exp(np.float64(ordered[11]) - np.float64(ordered[0])))}


@pytest.mark.parametrize("form", ["top_p_min_p_removal_choice", "top_k_top_p_min_p_removal_choice",
                                  "top_p_min_p_removal_exponential_race", "top_p_min_p_removal_log_softmax"])
def test_hugging_face_top_p_then_min_p_draws_are_the_programs(form: str) -> None:
    """generate()'s Temperature, [TopK,] TopP then MinP, drawn in the two bands at once (`top_p_min_p_draw_by_band`),
    with p the exact mass at a sorted place and min-p the ratio of a token's probability: rounding decides both."""
    top_k = 40 if form.startswith("top_k_") else 0
    draw = form.split("min_p_removal_")[1]

    def by_band(x: jax.Array, key: jax.Array, params: dict) -> jax.Array:
        return sampling.top_p_min_p_draw_by_band(draw, x, key, params)

    def lowering(params: dict) -> Callable[..., jax.Array]:
        return sampling.top_p_chain_lowering(form, params)

    _assert_certified_draws_are_the_programs(form, by_band, lowering, from_below=True, top_k=top_k,
                                             more_params=_min_p_at_a_token)


def test_min_p_band_holds_the_programs_removal() -> None:
    """`min_p_band`: every token below the band is removed by MinPLogitsWarper's f32 ops, every token above it kept,
    for min-p at the ratio of a token's probability (so on the edge of rounding) and at random, and the band is
    narrow (a few tokens of a 32000-token row in it)."""
    rng = np.random.default_rng(4)
    y = (rng.standard_normal((32, 32000)) * rng.choice([1.0, 3.0, 6.0], (32, 1))).astype(np.float32)
    for min_p in [_min_p_at_a_token(row, 1.0)["min_p"] for row in y[:4]] + [0.05, 0.3, 1e-6]:
        probs = jax.nn.softmax(jnp.asarray(y), axis=-1)
        removed = np.asarray(probs < min_p * jnp.max(probs, axis=-1, keepdims=True))
        lo, hi = (np.asarray(b)[:, None] for b in sampling.min_p_band(jnp.asarray(y), min_p))
        assert np.all(removed[y < lo]) and not np.any(removed[y > hi]), min_p
        assert np.sum((y >= lo) & (y <= hi)) <= 32 * 4, min_p


@pytest.mark.parametrize("form", ["top_p_ascending_mask", "top_p_ascending_mask_choice",
                                  "top_p_ascending_mask_log_softmax", "top_p_ascending_mask_log_of_softmax",
                                  "top_p_ascending_mask_exponential_race"])
def test_hugging_face_top_p_draws_are_the_programs(form: str) -> None:
    """TopPLogitsWarper's `cumsum <= 1 - p` from the bottom, by sorted place, under each draw of BAND_DRAWS (a
    log-probability draw certified also by its lead over the runner-up)."""
    draw = form.removeprefix("top_p_ascending_mask").removeprefix("_")

    def by_band(x: jax.Array, key: jax.Array, params: dict) -> jax.Array:
        return sampling.nucleus_draw_by_band(draw, x, key, params["p"], params["temperature"], from_below=True,
                                             by_place=True)

    def lowering(params: dict) -> Callable[..., jax.Array]:
        return sampling.top_p_ascending_lowering(form, params)

    _assert_certified_draws_are_the_programs(form, by_band, lowering, from_below=True)
    if draw == "":  # the kernel's own form for it
        _assert_certified_draws_are_the_programs(form, _kernel_form("top_p_mask_from_below"), lowering, True)


def test_flax_top_p_draws_are_the_programs() -> None:
    """FlaxTopPLogitsWarper's exclusive cumsum from the top, by sorted place (lax.top_k's order of ties)."""
    def by_band(x: jax.Array, key: jax.Array, params: dict) -> jax.Array:
        return sampling.nucleus_draw_by_band("", x, key, params["p"], params["temperature"], from_below=False,
                                             by_place=True)

    def lowering(params: dict) -> Callable[..., jax.Array]:
        return sampling.flax_top_p_lowering("top_p_flax_mask", params)

    _assert_certified_draws_are_the_programs("top_p_flax_mask", by_band, lowering, from_below=False)


def test_mesh_transformer_jax_top_p_draws_are_the_programs() -> None:
    """mesh-transformer-jax's `cumsum > p` removal shifted by one, from the top, by sorted place (jnp.argsort's order of
    ties, reversed), its removed logits x - 1e10: the band Flax's `<` cut has holds its `<=` (p at an exact cumulative
    mass is where they differ), and drops the removed as -inf does for T up to MTJ_BAND_TEMPERATURE; past it, and in
    bf16, the kernel's sort of the row."""
    def by_band(x: jax.Array, key: jax.Array, params: dict) -> jax.Array:
        return sampling.nucleus_draw_by_band("", x, key, params["p"], params["temperature"], from_below=False,
                                             by_place=True)

    def lowering(params: dict) -> Callable[..., jax.Array]:
        return sampling.flax_top_p_lowering("top_p_mtj_mask", params)

    assert _assert_certified_draws_are_the_programs("top_p_mtj_mask", by_band, lowering, from_below=False) < ROWS * 2
    row, p = _row_and_p("coarse_ties", 5, from_below=False)
    x = jnp.asarray(np.stack([np.roll(row, 37 * r) for r in range(8)]))
    key = jnp.array([3, 7], jnp.uint32)
    for temperature, dtype in ((1e9, jnp.float32), (0.7, jnp.bfloat16)):  # the sorted row: the program's ids
        params = form_params("top_p_mtj_mask", temperature=temperature, p=p)
        np.testing.assert_array_equal(jax.jit(lowering(params))(x.astype(dtype), key),
                                      sample_reference(x.astype(dtype), key, form="top_p_mtj_mask", **params))


def test_levanter_top_p_draws_are_the_programs() -> None:
    """Levanter's nucleus of y = x / T, rank j kept where the cumsum before it is below p (a stable argsort reversed:
    the higher id first among ties), is Flax's cut of y: its band vouches for a draw (p at an exact cumulative mass,
    ties across the cut: the sorted row), and the lowering gives the program's ids on every row; in bf16, the kernel's
    sort of the row."""
    def by_band(x: jax.Array, key: jax.Array, params: dict) -> jax.Array:
        return sampling.nucleus_draw_by_band("", x / params["temperature"], key, params["p"], 1.0, from_below=False,
                                             by_place=True)

    def lowering(params: dict) -> Callable[..., jax.Array]:
        return sampling.flax_top_p_lowering("top_p_levanter_mask", params)

    assert _assert_certified_draws_are_the_programs("top_p_levanter_mask", by_band, lowering, from_below=False) \
        < ROWS * 2
    row, p = _row_and_p("coarse_ties", 5, from_below=False)
    x = jnp.asarray(np.stack([np.roll(row, 37 * r) for r in range(8)])).astype(jnp.bfloat16)
    key = jnp.array([3, 7], jnp.uint32)
    params = form_params("top_p_levanter_mask", temperature=0.7, p=p)
    np.testing.assert_array_equal(jax.jit(lowering(params))(x, key),
                                  sample_reference(x, key, form="top_p_levanter_mask", **params))
    # four equal logits across the cut (two of them kept: ids 3 and 2, the higher first), in f32 and bf16, many keys
    ties = jnp.asarray(np.tile(np.array([1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0], np.float32), (16, 1)))
    params = form_params("top_p_levanter_mask", temperature=1.0, p=0.3)
    for dtype in (jnp.float32, jnp.bfloat16):
        for seed in range(4):
            key = jnp.array([seed, 11], jnp.uint32)
            got = jax.jit(lowering(params))(ties.astype(dtype), key)
            np.testing.assert_array_equal(got, sample_reference(ties.astype(dtype), key, form="top_p_levanter_mask",
                                                                **params))
            assert set(np.asarray(got).tolist()) <= {2, 3}


@pytest.mark.parametrize("form", ["top_p_haiku_mask", "top_p_haiku_logits_mask"])
def test_haiku_top_p_draws_are_the_programs(form: str) -> None:
    """Haiku's and grok-1's nucleus of y = x / T (the smallest values removed while their ascending cumsum is below
    1 - p, every copy of the cut's value kept), and perceiver-ar's of the logits then / T, are the band's nucleus
    from below by value: every draw the band vouches for is the program's (1 - p at exact cumulative masses, ties),
    most rows are vouched for, and the lowering gives the program's ids on every row."""
    def by_band(x: jax.Array, key: jax.Array, params: dict) -> jax.Array:
        return sampling._haiku_nucleus_by_band(x, key, params, form)

    def lowering(params: dict) -> Callable[..., jax.Array]:
        return sampling.function_form_lowering(form, params)

    assert _assert_certified_draws_are_the_programs(form, by_band, lowering, from_below=True) < ROWS * 2


@pytest.mark.parametrize("form", ["top_p_shifted_mask", "top_p_shifted_mask_choice", "top_p_shifted_logits_mask",
                                  "top_p_shifted_logits_mask_choice"])
def test_classic_top_p_draws_are_the_programs(form: str) -> None:
    """Megatron-LM's (Hugging Face's old `top_k_top_p_filtering`) `cumsum > p` removal of y = x / T shifted by one, and
    x-transformers' of the logits (then / T), from the top, by sorted place (torch.sort's order of ties through
    torchax: the reverse of XLA's unstable ascending sort): Flax's band of what is cut vouches for a draw, and the
    lowering gives the program's ids on every row, ties across the cut included (those run the program's own
    function)."""
    draw = "choice" if form.endswith("_choice") else ""
    of_logits = form.startswith("top_p_shifted_logits_mask")

    def by_band(x: jax.Array, key: jax.Array, params: dict) -> jax.Array:
        if of_logits:
            return sampling.nucleus_draw_by_band(draw, x, key, params["p"], params["temperature"], from_below=False,
                                                 by_place=True)
        return sampling.nucleus_draw_by_band(draw, x / params["temperature"], key, params["p"], 1.0, from_below=False,
                                             by_place=True)

    def lowering(params: dict) -> Callable[..., jax.Array]:
        return sampling.shifted_top_p_lowering(form, params)

    assert _assert_certified_draws_are_the_programs(form, by_band, lowering, from_below=False) < ROWS * 2


@pytest.mark.parametrize("form", ["top_k_top_p_shifted_mask", "top_k_top_p_shifted_mask_choice",
                                  "top_k_top_p_flipped_mask", "top_k_keep_top_p_descending_mask",
                                  "top_k_top_p_descending_mask_choice"])
def test_old_top_k_top_p_filtering_draws_are_the_programs(form: str) -> None:
    """Hugging Face's old `top_k_top_p_filtering` after / T: the top-k mask of y (ties of the k-th kept: the coarse ties
    make rows with more than k, which are UNCERTIFIED), then the classic cut, drawn by the band among the kernel's top
    k of y (`top_k_nucleus_draw`, from the top), with p the exact mass of some of the top 40. The same for the chains
    as JAX code writes them (a top-k kept at or above the sort's k-th, or masked below it; then the classic cut by a
    flipped or a descending argsort)."""
    draw = FORMS[form].drawn_by

    def by_band(x: jax.Array, key: jax.Array, params: dict) -> jax.Array:
        return sampling.top_k_nucleus_draw(draw, x / params["temperature"], key, params | {"temperature": 1.0},
                                           from_below=False, exact_k=False)

    def lowering(params: dict) -> Callable[..., jax.Array]:
        return sampling.shifted_top_p_lowering(form, params)

    _assert_certified_draws_are_the_programs(form, by_band, lowering, from_below=False, top_k=40)


@pytest.mark.parametrize("form", ["top_p_unshifted_mask", "top_p_unshifted_mask_choice",
                                  "top_p_unshifted_mask_log_softmax", "top_k_top_p_unshifted_mask",
                                  "top_k_keep_top_p_unshifted_mask_choice"])
def test_unshifted_top_p_draws_are_the_programs(form: str) -> None:
    """The JAX cut not shifted (`cumsum > p` removed as it is: the crossing token goes too), alone and after a top-k:
    the classic cut's band with its crossing token not vouched for (`crossing_dropped`), and the rows that keep
    nothing, certify only the program's draws, a quarter of these rows at least, and the lowering gives the program's
    ids on every row."""
    draw = FORMS[form].drawn_by
    top_k = 40 if form.startswith("top_k_") else 0

    def by_band(x: jax.Array, key: jax.Array, params: dict) -> jax.Array:
        top_k_filter = (sampling._keep_top_k_by_kernel if "keep" in form else masked_top_k()) if top_k else None
        return sampling.unshifted_nucleus_draw(form, x / params["temperature"], key, params, top_k_filter)

    def lowering(params: dict) -> Callable[..., jax.Array]:
        return sampling.unshifted_top_p_lowering(form, params)

    rows = ROWS // 4 if draw == "choice" else ROWS  # (the rows are built to put p at a cut: many are in its band)
    assert _assert_certified_draws_are_the_programs(form, by_band, lowering, False, top_k) < rows * len(KINDS) * 3 / 4


def test_the_classic_band_would_vouch_for_the_unshifted_cuts_crossing_token() -> None:
    """Where the crossing token is alone at the top of its band, the classic cut keeps it and the unshifted one drops
    it: the classic band vouches for it (a wrong draw for the unshifted cut), `crossing_dropped` does not."""
    x = jnp.asarray([[4.0, 3.0, 2.0, 1.0, 0.0, -1.0, -2.0]], jnp.float32)
    probs = np.asarray(jax.nn.softmax(x[0]), np.float64)
    p = float(probs[0] + probs[1] / 2)  # 3.0 crosses p: the classic cut keeps it, the unshifted one does not
    lo, hi = sampling.nucleus_band(x, p, from_below=False, by_place=True)
    assert float(lo[0]) == 3.0 and float(hi[0]) < 3.0  # the classic band: 3.0 surely kept
    assert float(sampling.crossing_dropped(hi)[0]) == 3.0  # not vouched for: a draw of 3.0 is left to the program


def test_unshifted_cut_of_a_row_that_keeps_nothing_draws_the_fill() -> None:
    """A row whose top token alone is above p keeps nothing: its draw is over the fill alone (id 0 at -inf, under every
    draw of BAND_DRAWS; any id at a finite fill). The band's floor vouches for that where the top token is alone and
    above p past rounding, with no sort; the lowering gives the program's ids."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((8, 2000)).astype(np.float32)
    x[:4, 17] = 30.0  # alone above p
    x[4, 17] = x[4, 18] = 30.0  # two copies of the top: the first place holds half the mass
    others = np.exp(np.delete(x[5], 17).astype(np.float64)).sum()
    x[5, 17] = np.log(others * 0.85 / 0.15)  # alone, at a probability of 0.85: kept
    for form, fill in (("top_p_unshifted_mask", None), ("top_p_unshifted_mask", -1e9),
                       ("top_k_top_p_unshifted_mask_choice", None)):
        params = form_params(form, temperature=1.0, p=0.9, k=40) | ({} if fill is None else {"fill": fill})
        key = jnp.array([3, 9], jnp.uint32)
        top_k_filter = masked_top_k() if form.startswith("top_k_") else None
        drawn = np.asarray(sampling.unshifted_nucleus_draw(form, jnp.asarray(x), key, params, top_k_filter))
        ref = sample_reference(jnp.asarray(x), key, form=form, **params)
        np.testing.assert_array_equal(drawn[:4], ref[:4], err_msg=f"{form}: vouched for with no sort")
        if fill is None:
            np.testing.assert_array_equal(drawn[:4], [sampling.EMPTY_ROWS_DRAW] * 4)
        np.testing.assert_array_equal(jax.jit(sampling.unshifted_top_p_lowering(form, params))(jnp.asarray(x), key),
                                      ref, err_msg=form)
    for draw in sampling.BAND_DRAWS:
        form = f"top_p_unshifted_mask{'_' * bool(draw)}{draw}"
        key = jnp.array([[4, 1], [5, 2], [6, 3]] if draw == "row_keys" else [4, 1], jnp.uint32)
        empty = jnp.full((3, 50), -jnp.inf)  # every draw of a row of -inf: the first id
        params = form_params(form, temperature=1.0, p=0.9)
        np.testing.assert_array_equal(sample_reference(empty, key, form=form, **params),
                                      [sampling.EMPTY_ROWS_DRAW] * 3, err_msg=form)


ROW_KEY_BANDS = (("top_p_descending_mask_row_keys", sampling.shifted_top_p_lowering),
                 ("top_k_keep_top_p_descending_mask_row_keys", sampling.shifted_top_p_lowering),
                 ("top_p_ascending_mask_row_keys", sampling.top_p_ascending_lowering),
                 ("top_p_mask_row_keys", sampling.drawn_form_lowering),
                 ("top_p_unshifted_mask_row_keys", sampling.unshifted_top_p_lowering))


@pytest.mark.parametrize(("form", "lowering"), ROW_KEY_BANDS, ids=[form for form, _ in ROW_KEY_BANDS])
def test_a_key_per_row_is_drawn_in_the_band(form: str, lowering: Callable[..., Callable[..., jax.Array]]) -> None:
    """A nucleus drawn with a key per row (a per-sequence sampler vmapped with its keys: `row_keys`): the band vouches
    for each row's draw under its own key's noise, as for one key's, so the compiled program's entry holds no sort
    (the kernel's, or XLA's, only in a conditional's branch), and the ids are the program's on every kind of row."""
    params = form_params(form, temperature=0.7, p=0.9, k=40)
    lowered = jax.jit(lowering(form, params))
    for i, kind in enumerate(KINDS):
        row, _ = _row_and_p(kind, 40 + i, from_below=False)
        x = jnp.asarray(np.stack([np.roll(row, 37 * r) for r in range(16)]))
        keys = jax.random.key_data(jax.random.split(jax.random.key(i), 16))
        np.testing.assert_array_equal(lowered(x, keys), sample_reference(x, keys, form=form, **params),
                                      err_msg=f"{form}: {kind}")
    hlo = lowered.lower(jax.ShapeDtypeStruct((2, 12288), jnp.float32),
                        jax.ShapeDtypeStruct((2, 2), jnp.uint32)).compile().as_text()
    entry = next(block for block in hlo.split("\n\n") if block.startswith("ENTRY"))
    assert "conditional(" in entry and " sort(" not in entry and sampling.SORT_TARGET not in entry


def test_classic_top_p_rows_with_infinities_or_nan_are_the_programs() -> None:
    """A row with a NaN, a +inf or -infs: the band vouches for none with a NaN or +inf (the program's softmax is NaN),
    and the lowering gives the program's ids; the compiled program's entry holds no sort (XLA's runs in a branch)."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((6, 500)).astype(np.float32) * 3
    x[0, 7] = np.nan
    x[1, 9] = np.inf
    x[2, :400] = -np.inf
    x[3, :] = -np.inf
    x[4, 11] = -np.nan
    for form in ("top_p_shifted_mask", "top_p_shifted_mask_choice", "top_p_shifted_logits_mask_choice",
                 "top_k_top_p_shifted_mask_choice", "top_k_keep_top_p_descending_mask", "top_k_top_p_flipped_mask"):
        params = form_params(form, temperature=0.7, p=0.9, k=50)
        lowered = jax.jit(sampling.shifted_top_p_lowering(form, params))
        for seed in range(3):
            key = jnp.array([seed, 11], jnp.uint32)
            np.testing.assert_array_equal(lowered(jnp.asarray(x), key), sample_reference(x, key, form=form, **params),
                                          err_msg=f"{form} seed {seed}")
        hlo = lowered.lower(jax.ShapeDtypeStruct((2, 12288), jnp.float32),
                            jax.ShapeDtypeStruct((2,), jnp.uint32)).compile().as_text()
        entry = next(block for block in hlo.split("\n\n") if block.startswith("ENTRY"))
        band = sampling.TOP_K_TARGET if "k" in params and params["k"] else sampling.NUCLEUS_BAND_TARGET
        assert f'custom_call_target="{band}"' in entry and "conditional(" in entry
        assert " sort(" not in entry and "TopK" not in entry and " sort(" in hlo


def _prob_sorted_by_band(x: jax.Array, key: jax.Array, params: dict, runs_checked: bool = True) -> jax.Array:
    """transformer_vq's nucleus drawn by Hugging Face's band of y = x / T (by place, from below), its probability runs
    checked (`runs_checked`), UNCERTIFIED rows as they are."""
    y = x / params["temperature"]
    lo, hi = sampling.nucleus_band(y, params["p"], from_below=True, by_place=True)
    tokens = sampling.draw_in_band("", y, key, lo, hi, 1.0)
    clear = sampling._probability_runs_clear(y, tokens, lo, jnp.max(y, axis=-1), jnp.min(y, axis=-1))
    return jnp.where(clear | (not runs_checked), tokens, UNCERTIFIED)


def test_transformer_vq_top_p_draws_are_the_programs() -> None:
    """transformer_vq's nucleus (the softmax sorted by a stable argsort, `cumsum > 1 - p`, the top forced, the mask
    multiplied in): Hugging Face's band by place from below certifies its draws where no run of equal probabilities
    holds the winner or crosses the band, and the lowering gives the program's ids."""
    def lowering(params: dict) -> Callable[..., jax.Array]:
        return sampling.prob_sorted_top_p_lowering("top_p_prob_sorted_mask", params)

    uncertified = _assert_certified_draws_are_the_programs("top_p_prob_sorted_mask", _prob_sorted_by_band, lowering,
                                                           from_below=True)
    assert uncertified < ROWS * 2


def test_transformer_vq_orders_equal_probabilities_by_id() -> None:
    """Distinct logits 2^-26 apart near 0, whose probabilities round equal in runs of about four, with the cut (p =
    0.5) among them: the program orders each run by id, the opposite of its order by logit here. Hugging Face's band
    alone draws other ids than the program's for some rows; the lowering's run checks leave those rows to the
    kernel's sort of the probabilities, and every id is the program's."""
    vocab, rows = 64, 32
    row = (-np.arange(vocab) * 2.0**-26).astype(np.float32)  # the larger logit has the lower id
    rng = np.random.default_rng(5)
    x = jnp.asarray(np.stack([row[rng.permutation(vocab)] for _ in range(rows)]))
    params = form_params("top_p_prob_sorted_mask", temperature=1.0, p=0.5)
    lowered = jax.jit(sampling.prob_sorted_top_p_lowering("top_p_prob_sorted_mask", params))
    by_logit = jax.jit(lambda x, key: _prob_sorted_by_band(x, key, params, runs_checked=False))
    differs = 0
    for seed in range(8):
        key = jnp.array([seed, 3], jnp.uint32)
        ref = np.asarray(sample_reference(x, key, form="top_p_prob_sorted_mask", **params))
        np.testing.assert_array_equal(lowered(x, key), ref)
        band = np.asarray(by_logit(x, key))
        differs += int(np.sum((band != UNCERTIFIED) & (band != ref)))
    assert differs > 0, "the rows never tell the two orders apart: the test would pass without the run checks"


def test_transformer_vq_rows_with_infinities_or_nan_are_the_programs() -> None:
    """The multiplied mask turns a removed -inf into NaN (-inf * 0 - 1e10), which the draw takes first: rows with
    -inf logits draw their first -inf, and rows with a NaN, a +inf or only -inf give the program's ids too."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((6, 500)).astype(np.float32) * 3
    x[0, rng.random(500) < 0.3] = -np.inf
    x[1, 17] = -np.inf
    x[2, 40] = np.nan
    x[3, 99] = np.inf
    x[4] = -np.inf
    x[5, 7], x[5, 300] = -np.inf, np.nan
    params = form_params("top_p_prob_sorted_mask", temperature=0.8, p=0.9)
    lowered = jax.jit(sampling.prob_sorted_top_p_lowering("top_p_prob_sorted_mask", params))
    for seed in range(6):
        key = jnp.array([seed, 11], jnp.uint32)
        ref = sample_reference(jnp.asarray(x), key, form="top_p_prob_sorted_mask", **params)
        np.testing.assert_array_equal(lowered(jnp.asarray(x), key), ref, err_msg=f"seed {seed}")
        assert int(ref[0]) == int(np.argmax(x[0] == -np.inf)) and int(ref[1]) == 17


def test_probability_runs_clear_checks_each_way_the_orders_can_part() -> None:
    """`_probability_runs_clear` on one row of 8, winner id 2 (logit 0.5), the band's lower end 0.1: clear as it
    is; not clear with a distinct logit a few ulps from the winner's (their probabilities may round equal, and the
    program orders them by id), nor with one a few ulps below the lower end next to the least above it, nor with the
    winner's logit at -2e9 (a removed token's -1e10 + noise could then win)."""
    base = np.array([0.0, -1.0, 0.5, 0.1, -3.0, 2.0, -0.5, 1.0], np.float32)
    tokens, lo = jnp.array([2], jnp.int32), jnp.array([0.1], jnp.float32)

    def clear(row: np.ndarray, lo: jax.Array = lo) -> bool:
        y = jnp.asarray(row[None])
        return bool(sampling._probability_runs_clear(y, tokens, lo, jnp.max(y, axis=-1), jnp.min(y, axis=-1))[0])

    assert clear(base)
    beside_winner = base.copy()
    beside_winner[6] = np.nextafter(np.float32(0.5), np.float32(0), dtype=np.float32)
    assert not clear(beside_winner)
    equal_to_winner = base.copy()
    equal_to_winner[6] = 0.5  # a copy: equal logits, which Hugging Face's band already takes in any order
    assert clear(equal_to_winner)
    across_lo = base.copy()
    across_lo[0] = np.nextafter(np.float32(0.1), np.float32(0), dtype=np.float32)
    assert not clear(across_lo)
    low = base - np.float32(2e9)
    assert not clear(low, lo - np.float32(2e9))


@pytest.mark.parametrize("form", ["top_k_top_p_ascending_mask", "top_k_top_p_ascending_mask_choice",
                                  "top_k_top_p_ascending_mask_log_softmax", "top_k_exact_top_p_flax_mask"])
def test_top_k_then_top_p_draws_are_the_programs(form: str) -> None:
    """Hugging Face's TopK then TopP warpers (the mask keeps ties of the k-th: the coarse ties make rows with more than
    k, which are UNCERTIFIED) under each draw of BAND_DRAWS, and Flax's exact top-k then top-p: the band among the top k
    (`top_k_nucleus_draw`), with p the exact mass of some of the top 40 (rounding decides the cut)."""
    flax = form == "top_k_exact_top_p_flax_mask"
    draw = "" if flax else form.removeprefix("top_k_top_p_ascending_mask").removeprefix("_")

    def by_band(x: jax.Array, key: jax.Array, params: dict) -> jax.Array:
        return sampling.top_k_nucleus_draw(draw, x, key, params, from_below=not flax, exact_k=flax)

    def lowering(params: dict) -> Callable[..., jax.Array]:
        return (sampling.flax_top_p_lowering if flax else sampling.top_p_ascending_lowering)(form, params)

    _assert_certified_draws_are_the_programs(form, by_band, lowering, from_below=not flax, top_k=40)


def test_tunix_top_p_draws_are_the_programs() -> None:
    """tunix's nucleus of all V sorted logits, drawn over ranks: the band, the kernel's top candidates as the first
    ranks, the draw at the program's rank counters."""
    def by_band(x: jax.Array, key: jax.Array, params: dict) -> jax.Array:
        return sampling._rank_nucleus_by_band(x, key, params)

    def lowering(params: dict) -> Callable[..., jax.Array]:
        return sampling.function_form_lowering("top_p_of_logits_exclusive", params)

    _assert_certified_draws_are_the_programs("top_p_of_logits_exclusive", by_band, lowering, from_below=False)


def test_pax_top_p_draws_are_the_programs() -> None:
    """Pax's top_p_mask_logits of the whole row (`cumsum <= 1 - p` from the bottom, cut by value), drawn by argmax(x +
    gumbel * T)."""
    def lowering(params: dict) -> Callable[..., jax.Array]:
        return sampling.noise_scaled_lowering("top_p_noise_scaled", params)

    _assert_certified_draws_are_the_programs("top_p_noise_scaled", sampling.pax_nucleus_by_band, lowering,
                                             from_below=True)


def test_a_band_by_value_would_vouch_for_wrong_ties_of_a_cut_by_place() -> None:
    """Why `by_place` exists: Flax keeps the first copies of a value tied at its cut and drops the later ones, so a
    band that keeps every copy of its upper end alike (right for a cut by value) certifies tokens the program drops."""
    def by_value(x: jax.Array, key: jax.Array, params: dict) -> jax.Array:
        return sampling.nucleus_draw_by_band("", x, key, params["p"], params["temperature"], from_below=False,
                                             by_place=False)

    def lowering(params: dict) -> Callable[..., jax.Array]:
        return sampling.flax_top_p_lowering("top_p_flax_mask", params)

    with pytest.raises(AssertionError, match="a certified draw, coarse_ties"):
        _assert_certified_draws_are_the_programs("top_p_flax_mask", by_value, lowering, from_below=False)


def test_top_p_mask_gives_the_programs_token_where_rounding_moves_the_cut() -> None:
    """nucleus_rounding's row, in a batch of 512 copies: row ROW draws the token only the program's rounding keeps
    (a kernel deciding the cut by its f64 mass draws 2637 there)."""
    x, p = nucleus_rounding.rounded_cut()
    rows = jnp.broadcast_to(x, (512, x.shape[-1]))
    key = jnp.asarray(nucleus_rounding.KEY, jnp.uint32)
    params = dict(temperature=nucleus_rounding.TEMPERATURE, p=p)
    ref = jax.jit(lambda x, key: sample_reference(x, key, form="top_p_mask", **params))(rows, key)
    assert int(ref[nucleus_rounding.ROW]) == nucleus_rounding.program_token(x, p)
    np.testing.assert_array_equal(jax.jit(lambda x, key: sampling.sample(x, key, form="top_p_mask", **params))(
        rows, key), ref)


@pytest.mark.parametrize("scale", [3.0, 6.0], ids=["hundreds_kept", "a_few_kept"])
def test_few_rows_are_left_to_the_programs_cut(scale: float) -> None:
    """On rows of a real vocabulary's width the band is narrow: at most 5% of draws fall in it, for each family."""
    x = jnp.asarray(np.random.default_rng(1).standard_normal((64, 32000)).astype(np.float32) * scale)
    key = jnp.array([0, 3], jnp.uint32)
    params = dict(temperature=0.7, p=0.9, k=50)
    for name, tokens in (
        ("top_p_mask", _kernel_form("top_p_mask")(x, key, params)),
        ("top_k_top_p_mask", _kernel_form("top_k_top_p_mask")(x, key, params)),
        ("hugging_face", _kernel_form("top_p_mask_from_below")(x, key, params)),
        ("hugging_face_choice", sampling.nucleus_draw_by_band("choice", x, key, 0.9, 0.7, from_below=True,
                                                              by_place=True)),
        ("flax", sampling.nucleus_draw_by_band("", x, key, 0.9, 0.7, from_below=False, by_place=True)),
        ("hugging_face_top_k_choice", sampling.top_k_nucleus_draw("choice", x, key, params, from_below=True,
                                                                  exact_k=False)),
        ("flax_top_k", sampling.top_k_nucleus_draw("", x, key, params, from_below=False, exact_k=True)),
        ("tunix", sampling._rank_nucleus_by_band(x, key, params)),
        ("pax", sampling.pax_nucleus_by_band(x, key, params)),
        ("race", sampling.nucleus_draw_by_band("exponential_race", x, key, 0.9, 0.7, from_below=False,
                                               by_place=False)),
        ("top_k_race", sampling.top_k_nucleus_draw("exponential_race", x, key, params, from_below=False,
                                                   exact_k=False)),
        ("unshifted", sampling.unshifted_nucleus_draw("top_p_unshifted_mask", x / 0.7, key, params, None)),
        ("unshifted_top_k_choice", sampling.unshifted_nucleus_draw("top_k_top_p_unshifted_mask_choice", x / 0.7, key,
                                                                   params, masked_top_k())),
        ("hugging_face_top_k_min_p_choice", sampling.top_p_min_p_draw_by_band("choice", x, key,
                                                                              params | {"min_p": 0.05})),
        ("hugging_face_min_p_choice", sampling.top_p_min_p_draw_by_band("choice", x, key,
                                                                        params | {"min_p": 0.05, "k": 0})),
    ):
        assert float(jnp.mean(tokens == UNCERTIFIED)) <= 0.05, name


# (Hugging Face's TopP alone draws in its band in the kernel's one call, `_nucleus_draw_in_one_call`.)
SORTS_IN_A_BRANCH = (("top_p_ascending_mask_choice", sampling.TARGET),
                     ("top_k_top_p_ascending_mask_choice", sampling.TOP_K_TARGET),
                     ("top_p_mask_exponential_race", sampling.NUCLEUS_BAND_TARGET),
                     ("top_k_top_p_mask_log_softmax", sampling.TOP_K_TARGET),
                     ("top_p_min_p_removal_choice", sampling.NUCLEUS_BAND_TARGET),
                     ("top_k_top_p_min_p_removal_choice", sampling.TOP_K_TARGET),
                     ("top_p_unshifted_mask", sampling.NUCLEUS_BAND_TARGET),
                     ("top_k_keep_top_p_unshifted_mask_choice", sampling.TOP_K_TARGET))


@pytest.mark.parametrize(("form", "band_target"), SORTS_IN_A_BRANCH)
def test_top_p_sorts_only_in_a_branch(form: str, band_target: str) -> None:
    """The compiled program draws by the band (of the row, or of its top k) with no sort and no cumsum of the row; the
    kernel's sort (and XLA's, for ties straddling the removal) runs only in a conditional's branch."""
    params = form_params(form, temperature=0.8, p=0.9, k=50, min_p=0.05)
    if "min_p" in form:
        lower = sampling.top_p_chain_lowering
    elif "unshifted" in form:
        lower = sampling.unshifted_top_p_lowering
    elif "ascending" in form:
        lower = sampling.top_p_ascending_lowering
    else:
        lower = sampling.drawn_form_lowering
    lowering = jax.jit(lower(form, params))
    hlo = lowering.lower(jax.ShapeDtypeStruct((2, 12288), jnp.float32),
                         jax.ShapeDtypeStruct((2,), jnp.uint32)).compile().as_text()
    entry = next(block for block in hlo.split("\n\n") if block.startswith("ENTRY"))
    assert f'custom_call_target="{band_target}"' in entry and "conditional(" in entry
    assert sampling.SORT_TARGET not in entry and " sort(" not in entry and "TopK" not in entry
    assert "f32[2,12288]{1,0} reduce-window(" not in entry  # no cumsum of the whole row outside the branch
    assert sampling.SORT_TARGET in hlo


def test_tokens_at_or_above_a_floor_come_in_lax_top_ks_order() -> None:
    """`at_or_above`: the first ranks of lax.top_k's order (+0 before -0, ties by the lower id), -inf and -1 after
    them, and their count; a row with more than k gives none."""
    rng = np.random.default_rng(5)
    x = np.round(rng.standard_normal((3, 500)) * 2).astype(np.float32)  # many ties
    x[0, ::7] = 0.0
    x[0, 3::7] = -0.0
    floor = jnp.asarray([-0.0, 1.0, -9.0], jnp.float32)
    values, ids, count = jax.jit(lambda x, f: sampling.at_or_above(x, f, 400))(jnp.asarray(x), floor)
    top_values, top_ids = jax.lax.top_k(jnp.asarray(x), 500)
    for row in range(2):
        n = int(np.sum(x[row] >= float(floor[row])))
        assert int(count[row]) == n <= 400
        np.testing.assert_array_equal(ids[row, :n], top_ids[row, :n])
        np.testing.assert_array_equal(np.signbit(values[row, :n]), np.signbit(top_values[row, :n]))
        assert bool(jnp.all(ids[row, n:] == -1)) and bool(jnp.all(values[row, n:] == -jnp.inf))
    assert int(count[2]) == 500 and bool(jnp.all(ids[2] == -1))  # more than k: none given


@pytest.mark.parametrize("form", ["top_p_mask_log_softmax", "top_p_mask_log_of_softmax"])
def test_a_log_probability_draw_with_a_near_tie_is_left_to_the_program(form: str) -> None:
    """The one-call log-probability draw (`_nucleus_draw_in_one_call`: kernel forms 14 and 15) scores x / T, not the
    program's log-probabilities, which differ by the normaliser up to rounding: a winner that leads the runner-up by
    a few ulps must be UNCERTIFIED (the program's rounding decides it), one that leads by far is certified, and every
    certified token is the program's. Each row is peaked on two tokens a and b whose perturbed scores x + g are set
    `gap` apart (g: the noise jax.random.categorical draws for that key)."""
    rows, vocab, p = 48, 4096, 0.9
    key = jnp.array([5, 11], jnp.uint32)
    noise = np.asarray(jax.random.gumbel(key, (rows, vocab), jnp.float32))
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((rows, vocab)) - 6.0).astype(np.float32)
    near = np.arange(rows) % 2 == 0  # even rows: a near tie; odd rows: a clear lead
    for r in range(rows):
        a = int(rng.integers(vocab))
        close = np.flatnonzero(np.abs(noise[r] - noise[r, a]) < 1.0)
        b = int(close[close != a][0])
        x[r, a] = np.float32(10.0)
        score_a = np.float32(x[r, a] + noise[r, a])
        gap = np.float32(np.spacing(score_a)) * (r % 7 - 3) if near[r] else np.float32(0.05)
        x[r, b] = np.float32(score_a + gap - noise[r, b])
    x = jnp.asarray(x)
    params = form_params(form, temperature=1.0, p=p)
    ref = np.asarray(jax.jit(lambda x, key: sample_reference(x, key, form=form, **params))(x, key))
    certified = np.asarray(jax.jit(lambda x, key: sampling.nucleus_draw_by_band(
        form.removeprefix("top_p_mask_"), x, key, p, 1.0, from_below=False, by_place=False))(x, key))
    drawn = certified != UNCERTIFIED
    np.testing.assert_array_equal(certified[drawn], ref[drawn])
    assert not np.any(drawn[near]), "a winner within a few ulps of the runner-up was vouched for"
    assert np.mean(drawn[~near]) >= 0.9, "clear leads were left to the program"
    np.testing.assert_array_equal(jax.jit(sampling.drawn_form_lowering(form, params))(x, key), ref)
