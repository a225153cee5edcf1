"""NKI flash attention for Trainium (prefill and decode), with the composite's exact semantics.

`attention` computes `attention_reference` (docs/composites.md) of the canonical operands q (B,T,N,H),
k (B,S,K,H), v (B,S,K,D): GQA/MQA, causal and sliding windows with a query offset, soft-cap, an additive
bias, a boolean mask and q/kv lengths, in f32, bf16 or f16 with fp32 logits, softmax and accumulation
(FlashAttention-2, Dao 2023: online softmax, one pass over K/V per query tile).

NKI layouts (the kernels' HBM operands; the wrapper transposes and pads, and XLA fuses that):
  prefill  q (B, N, H, T_pad)   k (B, K, H, S_pad)   v (B, K, S_pad, D)   out (B, N, T_pad, D)
  decode   q (B, T, H, N)       (k, v as prefill)                         out (B, T, N, D)
  both     bias (B, N, T_pad, S_pad) f32, keep (B, N, T_pad, S_pad) u8 (mask & lengths), when present
The head dim H is the partition (contraction) dim of q·kᵀ, so H <= 128. A query tile is `block_q` <= 128
rows (the stationary operand's free size); a key tile is `block_k` <= 512 keys (the moving operand's
free size, one PSUM bank of fp32). P·V contracts over keys in chunks of <= 128 partitions: each chunk of
P is transposed on TensorE and multiplied into one fp32 PSUM accumulator.

Prefill runs a grid (B, K, G) of programs, one per query head; decode (T <= 8 < S) runs (B, K), and for
each of the T positions stacks the G query heads sharing a kv head as the rows of one tile (GQA packing).
Masked logits take `masked_value` exactly, as in the reference (so a fully masked row is NaN for -inf
and the uniform average for a finite value); padded keys are -inf. With masked_value -inf, key tiles
that no row of a query tile can see (causal / window) are skipped.

The kernels are written against `nl` / `nisa` / `nki`: real `neuronxcc.nki` when it imports, else the
emulator (hlofuse.kernels.nki.emulator). `run_kernel` runs them on NumPy arrays under either.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from hlofuse.kernels.nki import emulator, hostcall
from hlofuse.kernels.reference import UNBOUNDED, ZERO_EMPTY_ROWS_FILL_LIMIT, attention_reference, zeroed_if_asked
from hlofuse.kernels.target import CompositeCall, KernelSpec, Lowered, Unsupported
from hlofuse.ops.attention import ATTENTION, AttentionAttrs
from hlofuse.partition.cuts import Cuts, decode_key_cuts
from hlofuse.partition.ranges import RangeSplit, decode_key_split

try:  # the real NKI, when the Neuron SDK is installed
    import neuronxcc.nki as nki  # type: ignore[import-not-found]
    import neuronxcc.nki.isa as nisa  # type: ignore[import-not-found]
    import neuronxcc.nki.language as nl  # type: ignore[import-not-found]

    HAVE_NEURONXCC = True
except ImportError:
    nki, nl, nisa = emulator.nki, emulator.nl, emulator.nisa
    HAVE_NEURONXCC = False

INSTALL_MESSAGE = (
    "no neuron kernel without the Neuron SDK: `neuronxcc` does not import here. Install it on a Trainium/"
    "Inferentia host (pip install neuronx-cc jax-neuronx --extra-index-url "
    "https://pip.repos.neuron.amazonaws.com), or use target=neuron-sim to run the NKI kernels on the CPU"
)
DTYPES = ("float32", "bfloat16", "float16")


def missing_sdk() -> str | None:
    """Why target=neuron cannot lower here (no neuronxcc), or None (its spec's `unavailable`)."""
    return None if HAVE_NEURONXCC else INSTALL_MESSAGE

MAX_HEAD_DIM = 128  # q·kᵀ contracts over H on the partition dim
MAX_VALUE_DIM = 512  # P·V's moving free size
DECODE_MAX_T = 8
BLOCK_Q = 128
BLOCK_K = 512
NEG_INF = float("-inf")


@dataclasses.dataclass(frozen=True)
class BlockSizes:
    """Query rows per tile (<= 128, partitions of the logits) and keys per tile (<= 512, one PSUM bank)."""

    block_q: int = BLOCK_Q
    block_k: int = BLOCK_K

    def __post_init__(self) -> None:
        if not 1 <= self.block_q <= 128 or not 1 <= self.block_k <= 512:
            raise ValueError(f"block_q {self.block_q} must be in [1, 128] and block_k {self.block_k} in [1, 512]")
        if self.block_k > 128 and self.block_k % 128:
            raise ValueError(f"block_k {self.block_k} above 128 must be a multiple of 128 (the P·V chunks)")

    @classmethod
    def get_default(cls) -> BlockSizes:
        return cls()


@dataclasses.dataclass(frozen=True)
class KernelConfig:
    """Everything the kernels know at trace time (JSON-able: it travels in the host call's config)."""

    scale: float
    softcap: float
    masked_value: float
    right: int | None  # visible iff key - query <= right (None: unbounded)
    left: int | None  # visible iff key - query >= -left
    q_offset: int
    s: int  # real keys; keys >= s are padding
    block_q: int
    block_k: int
    chunk: int  # keys per P·V matmul (<= 128)
    groups: int  # G = N / K
    with_lse: bool = False  # decode: out (B, T, N, D + 1) f32, the last column each row's log-sum-exp

    @property
    def skip(self) -> bool:
        """Whether invisible key tiles may be skipped: only when masked keys weigh exactly 0 in every row."""
        return math.isinf(self.masked_value)

    def key_blocks(self, q_first: int, q_last: int, num_blocks: int) -> tuple[int, int]:
        """[lo, hi) key tiles some query at positions q_first..q_last (before q_offset) may see."""
        lo, hi = 0, num_blocks
        if self.skip and self.right is not None:
            last_key = q_last + self.q_offset + self.right
            hi = min(hi, last_key // self.block_k + 1) if last_key >= 0 else 0
        if self.skip and self.left is not None:
            lo = max(lo, (q_first + self.q_offset - self.left) // self.block_k)
        return lo, max(lo, hi)


# ----------------------------------------------------------------------------- kernels


def _attend(
    q_tile: Any,
    k_ref: Any,
    v_ref: Any,
    bias_ref: Any,
    keep_ref: Any,
    side: Callable[..., Any],  # noqa: ANN401
    b: Any,
    kh: Any,
    q_pos: int,
    row_step: int,
    blocks: tuple[int, int],
    cfg: KernelConfig,
) -> Any:  # noqa: ANN401
    """One tile of query rows against key tiles [blocks): (rows, D) fp32 = softmax(masked logits) · V, and
    the rows' running max and softmax denominator, (rows, 1) each.

    q_tile (H, rows) in SBUF; row r sits at key position q_pos + r * row_step. side(ref, k0) is the
    (rows, block_k) HBM slice of bias/keep for the key tile at k0.
    """
    rows = q_tile.shape[1]
    d = v_ref.shape[3]
    kt = cfg.block_k
    m = nl.full((rows, 1), NEG_INF, dtype=nl.float32, buffer=nl.sbuf)  # running row max
    l_sum = nl.zeros((rows, 1), dtype=nl.float32, buffer=nl.sbuf)  # running softmax denominator
    acc = nl.zeros((rows, d), dtype=nl.float32, buffer=nl.sbuf)  # running P·V
    i_p = nl.arange(rows)[:, None]
    i_f = nl.arange(kt)[None, :]
    for kb in nl.sequential_range(blocks[0], blocks[1]):
        k0 = kb * kt
        k_tile = nl.load(k_ref[b, kh, :, nl.ds(k0, kt)])  # (H, kt)
        s = nl.multiply(nisa.nc_matmul(q_tile, k_tile), cfg.scale)  # (rows, kt) fp32: PSUM -> SBUF
        if cfg.softcap:
            s = nl.multiply(nl.tanh(nl.multiply(s, 1.0 / cfg.softcap)), cfg.softcap)
        if bias_ref is not None:
            s = nl.add(s, nl.load(side(bias_ref, k0)))
        visible = None
        if cfg.right is not None or cfg.left is not None:
            rel = nisa.iota(i_f - i_p * row_step + (k0 - q_pos), dtype=nl.int32)  # key pos - query pos
            if cfg.right is not None:
                visible = nl.less_equal(rel, cfg.right)
            if cfg.left is not None:
                lower = nl.greater_equal(rel, -cfg.left)
                visible = lower if visible is None else nl.logical_and(visible, lower)
        if keep_ref is not None:
            keep = nl.equal(nl.load(side(keep_ref, k0)), 1)
            visible = keep if visible is None else nl.logical_and(visible, keep)
        if visible is not None:
            s = nl.where(visible, s, cfg.masked_value)
        if cfg.s % kt:  # padded keys weigh nothing, whatever masked_value is
            key_pos = nisa.iota(i_p * 0 + i_f + k0, dtype=nl.int32)
            s = nl.where(nl.less(key_pos, cfg.s), s, NEG_INF)
        # online softmax: rescale what came before by exp(m_old - m_new)
        m_new = nl.maximum(m, nl.max(s, axis=1, keepdims=True))
        m_use = nl.where(nl.equal(m_new, NEG_INF), 0.0, m_new)  # rows with nothing visible yet
        p = nl.exp(nl.subtract(s, m_use))
        alpha = nl.exp(nl.subtract(m, m_use))
        l_sum[...] = nl.add(nl.multiply(l_sum, alpha), nl.sum(p, axis=1, keepdims=True))
        p_v = nl.copy(p, dtype=v_ref.dtype)  # P in V's dtype, as the reference's probs.astype(v.dtype)
        pv = nl.zeros((rows, d), dtype=nl.float32, buffer=nl.psum)
        for c in nl.affine_range(kt // cfg.chunk):
            p_t = nl.copy(nisa.nc_transpose(p_v[:, nl.ds(c * cfg.chunk, cfg.chunk)]), dtype=v_ref.dtype)
            v_tile = nl.load(v_ref[b, kh, nl.ds(k0 + c * cfg.chunk, cfg.chunk), :])  # (chunk, D)
            pv[...] += nisa.nc_matmul(p_t, v_tile)  # (rows, D) fp32 accumulated in PSUM
        acc[...] = nl.add(nl.multiply(acc, alpha), pv)
        m[...] = m_new
    return nl.divide(acc, l_sum), m, l_sum


def _log_sum_exp(m: Any, l_sum: Any) -> Any:  # noqa: ANN401
    """(rows, 1): m + log(l), -inf for a row that saw no key (l = 0, m = -inf)."""
    seen = nl.greater(l_sum, 0.0)
    return nl.where(seen, nl.add(m, nl.log(nl.where(seen, l_sum, 1.0))), NEG_INF)


def _flash_fwd_kernel(q_ref: Any, k_ref: Any, v_ref: Any, bias_ref: Any, keep_ref: Any, cfg: KernelConfig) -> Any:  # noqa: ANN401
    """Prefill, grid (B, K, G): q (B,N,H,T_pad), k (B,K,H,S_pad), v (B,K,S_pad,D) -> out (B,N,T_pad,D)."""
    batch, heads, _, t_pad = q_ref.shape
    d = v_ref.shape[3]
    out_ref = nl.ndarray((batch, heads, t_pad, d), dtype=q_ref.dtype, buffer=nl.shared_hbm)
    b, kh, g = nl.program_id(0), nl.program_id(1), nl.program_id(2)
    head = kh * cfg.groups + g
    rq = cfg.block_q
    num_k_blocks = k_ref.shape[3] // cfg.block_k
    for qi in nl.static_range(t_pad // rq):
        q0 = qi * rq
        q_tile = nl.load(q_ref[b, head, :, nl.ds(q0, rq)])  # (H, rq)

        def side(ref: Any, k0: Any, q0: int = q0) -> Any:  # noqa: ANN401
            return ref[b, head, nl.ds(q0, rq), nl.ds(k0, cfg.block_k)]

        blocks = cfg.key_blocks(q0, q0 + rq - 1, num_k_blocks)
        o, _, _ = _attend(q_tile, k_ref, v_ref, bias_ref, keep_ref, side, b, kh, q0 + cfg.q_offset, 1, blocks, cfg)
        nl.store(out_ref[b, head, nl.ds(q0, rq), :], value=nl.copy(o, dtype=q_ref.dtype))
    return out_ref


def _flash_decode_kernel(q_ref: Any, k_ref: Any, v_ref: Any, bias_ref: Any, keep_ref: Any, cfg: KernelConfig) -> Any:  # noqa: ANN401
    """Decode, grid (B, K): q (B,T,H,N), k (B,K,H,S_pad), v (B,K,S_pad,D) -> out (B,T,N,D); G heads per tile.
    With cfg.with_lse, out is (B,T,N,D+1) f32 and its last column each row's log-sum-exp."""
    batch, t, _, heads = q_ref.shape
    d = v_ref.shape[3]
    width, out_dtype = (d + 1, nl.float32) if cfg.with_lse else (d, q_ref.dtype)
    out_ref = nl.ndarray((batch, t, heads, width), dtype=out_dtype, buffer=nl.shared_hbm)
    b, kh = nl.program_id(0), nl.program_id(1)
    g = cfg.groups
    num_k_blocks = k_ref.shape[3] // cfg.block_k
    for ti in nl.static_range(t):
        q_tile = nl.load(q_ref[b, ti, :, nl.ds(kh * g, g)])  # (H, G): the heads sharing kv head kh

        def side(ref: Any, k0: Any, ti: int = ti) -> Any:  # noqa: ANN401
            return ref[b, nl.ds(kh * g, g), ti, nl.ds(k0, cfg.block_k)]

        blocks = cfg.key_blocks(ti, ti, num_k_blocks)
        o, m, l_sum = _attend(q_tile, k_ref, v_ref, bias_ref, keep_ref, side, b, kh, ti + cfg.q_offset, 0, blocks,
                              cfg)
        if cfg.with_lse:
            nl.store(out_ref[b, ti, nl.ds(kh * g, g), nl.ds(0, d)], value=o)
            nl.store(out_ref[b, ti, nl.ds(kh * g, g), nl.ds(d, 1)], value=_log_sum_exp(m, l_sum))
        else:
            nl.store(out_ref[b, ti, nl.ds(kh * g, g), :], value=nl.copy(o, dtype=q_ref.dtype))
    return out_ref


KERNELS = {"prefill": _flash_fwd_kernel, "decode": _flash_decode_kernel}


@functools.cache
def _kernel(name: str, simulator: bool) -> Any:  # noqa: ANN401
    """The nki.jit kernel `name`, bound to real NKI (`simulator`) or to the emulator."""
    if simulator:
        if not HAVE_NEURONXCC:
            raise RuntimeError(INSTALL_MESSAGE)
        return nki.jit(KERNELS[name])
    if not HAVE_NEURONXCC:
        return emulator.nki.jit(KERNELS[name])
    # neuronxcc is installed: rebind the kernel and its helper to the emulator's namespaces
    scope = dict(globals(), nl=emulator.nl, nisa=emulator.nisa, nki=emulator.nki)
    for fn in (_attend, _log_sum_exp, KERNELS[name]):
        scope[fn.__name__] = types.FunctionType(fn.__code__, scope, fn.__name__, fn.__defaults__, fn.__closure__)
    return emulator.nki.jit(scope[KERNELS[name].__name__])


def run_kernel(q: np.ndarray, k: np.ndarray, v: np.ndarray, *side: np.ndarray, kernel: str, roles: list[str],
               grid: list[int], config: dict[str, Any], simulator: bool = False) -> np.ndarray:  # fmt: skip
    """Runs kernel `kernel` on NumPy arrays in NKI layouts under the emulator or NKI's simulator."""
    named = dict(zip(roles, side, strict=True))
    cfg = KernelConfig(**config)
    args = (q, k, v, named.get("bias"), named.get("keep"))
    fn = _kernel(kernel, simulator)
    if simulator:
        return np.asarray(nki.simulate_kernel(fn[tuple(grid)], *args, cfg=cfg))
    return np.asarray(fn[tuple(grid)](*args, cfg=cfg))


# ----------------------------------------------------------------------------- the JAX wrapper


def check_shapes(q_shape: tuple[int, ...], k_shape: tuple[int, ...], v_shape: tuple[int, ...],
                 dtypes: list[str]) -> None:  # fmt: skip
    """Raises ValueError naming the values when the kernels cannot take these operands."""
    if len(q_shape) != 4 or len(k_shape) != 4 or len(v_shape) != 4:
        raise ValueError(f"q, k, v must be rank 4, got {q_shape}, {k_shape}, {v_shape}")
    b, t, n, h = q_shape
    s, kv_heads = k_shape[1], k_shape[2]
    if tuple(k_shape) != (b, s, kv_heads, h) or tuple(v_shape[:3]) != (b, s, kv_heads):
        raise ValueError(f"k {k_shape} / v {v_shape} do not match q {q_shape}")
    if kv_heads == 0 or n % kv_heads:
        raise ValueError(f"query heads N={n} are not a multiple of kv heads K={kv_heads}")
    if len(set(dtypes)) != 1 or dtypes[0] not in DTYPES:
        raise ValueError(f"q, k, v must share one dtype of {list(DTYPES)}, got {dtypes}")
    if h > MAX_HEAD_DIM:
        raise ValueError(f"head dim H={h} exceeds {MAX_HEAD_DIM} (the partition dim of q·kᵀ)")
    if v_shape[3] > MAX_VALUE_DIM:
        raise ValueError(f"value dim D={v_shape[3]} exceeds {MAX_VALUE_DIM} (the moving free size of P·V)")
    if is_decode(t, s) and n // kv_heads > 128:
        raise ValueError(f"decode packs the G={n // kv_heads} query heads of a kv head on partitions: G <= 128")


def is_decode(t: int, s: int) -> bool:
    return t <= DECODE_MAX_T < s


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def _tiles(t: int, s: int, blocks: BlockSizes) -> tuple[int, int, int]:
    """(block_q, block_k, chunk) for T queries and S keys."""
    block_q = min(blocks.block_q, t)
    block_k = min(blocks.block_k, s if s <= 128 else _round_up(s, 128))
    return block_q, block_k, min(128, block_k)


def attention(
    q: jax.Array,  # (B, T, N, H)
    k: jax.Array,  # (B, S, K, H), N % K == 0
    v: jax.Array,  # (B, S, K, D)
    *,
    scale: float,
    causal: bool = False,
    window_left: int = UNBOUNDED,
    window_right: int = UNBOUNDED,
    q_offset: int = 0,
    softcap: float = 0.0,
    masked_value: float = NEG_INF,
    bias: jax.Array | None = None,  # (B|1, N|1, T|1, S|1)
    mask: jax.Array | None = None,  # (B|1, N|1, T|1, S|1) bool, True = visible
    q_lengths: jax.Array | None = None,  # (B,) int
    kv_lengths: jax.Array | None = None,  # (B,) int
    runner: str = "sim",
    block_sizes: BlockSizes | None = None,
    return_lse: bool = False,
) -> Any:  # noqa: ANN401  (B, T, N, D) in q's dtype; with return_lse, that in f32 and the (B, T, N) lse
    """`attention_reference`'s semantics by the NKI kernels.

    `return_lse` (decode only) also returns each row's log-sum-exp over its visible keys (-inf where it sees
    none), and the output in f32: a partial result that `combine_partials` merges with other calls' over
    other keys (a KV sequence sharded over devices, hlofuse.shard_local).

    runner "sim": on this host, inside the program (a CPU custom call), under NKI's simulator when
    neuronxcc imports and the emulator otherwise ("emulator" / "simulator" force one). runner "device":
    traced with nki.jit on the JAX arrays, which emits the Neuron custom call (needs the Neuron SDK).
    """
    check_shapes(q.shape, k.shape, v.shape, [jnp.dtype(x.dtype).name for x in (q, k, v)])
    if math.isinf(masked_value) and masked_value > 0 or math.isnan(masked_value):
        raise ValueError(f"masked_value {masked_value} must be -inf or finite")
    b, t, n, h = q.shape
    s, kv_heads, d = k.shape[1], k.shape[2], v.shape[3]
    decode = is_decode(t, s)
    if return_lse and (not decode or not math.isinf(masked_value)):
        raise ValueError(f"return_lse needs the decode kernel (T <= {DECODE_MAX_T} < S, got T = {t}, S = {s}) and "
                         "masked_value -inf")
    block_q, block_k, chunk = _tiles(t, s, block_sizes or BlockSizes.get_default())
    t_pad, s_pad = (t if decode else _round_up(t, block_q)), _round_up(s, block_k)
    cfg = KernelConfig(
        scale=float(scale), softcap=float(softcap), masked_value=float(masked_value),
        right=0 if causal else (None if window_right == UNBOUNDED else int(window_right)),
        left=None if window_left == UNBOUNDED else int(window_left), q_offset=int(q_offset), s=s,
        block_q=block_q, block_k=block_k, chunk=chunk, groups=n // kv_heads, with_lse=return_lse,
    )  # fmt: skip

    def pad(x: jax.Array, axis: int, size: int) -> jax.Array:
        widths = [(0, 0)] * x.ndim
        widths[axis] = (0, size - x.shape[axis])
        return jnp.pad(x, widths)

    kr = pad(k.transpose(0, 2, 3, 1), 3, s_pad)  # (B, K, H, S_pad)
    vr = pad(v.transpose(0, 2, 1, 3), 2, s_pad)  # (B, K, S_pad, D)
    qr = q.transpose(0, 1, 3, 2) if decode else pad(q.transpose(0, 2, 3, 1), 3, t_pad)
    side: dict[str, jax.Array] = {}
    full = (b, n, t, s)
    if bias is not None:
        side["bias"] = pad(pad(jnp.broadcast_to(bias.astype(jnp.float32), full), 2, t_pad), 3, s_pad)
    if mask is not None or q_lengths is not None or kv_lengths is not None:
        keep = jnp.ones(full, jnp.bool_) if mask is None else jnp.broadcast_to(mask.astype(jnp.bool_), full)
        if kv_lengths is not None:
            keep = keep & (jnp.arange(s)[None, None, None, :] < kv_lengths[:, None, None, None])
        if q_lengths is not None:
            keep = keep & (jnp.arange(t)[None, None, :, None] < q_lengths[:, None, None, None])
        side["keep"] = pad(pad(keep.astype(jnp.uint8), 2, t_pad), 3, s_pad)
    name = "decode" if decode else "prefill"
    grid = [b, kv_heads] if decode else [b, kv_heads, n // kv_heads]
    out_shape = (b, t, n, d + return_lse) if decode else (b, n, t_pad, d)
    out_dtype = jnp.float32 if return_lse else q.dtype
    operands = [qr, kr, vr, *side.values()]
    if runner == "device":
        out = _device_call(name, grid, cfg, operands, list(side))
    else:
        if runner not in ("sim", "emulator", "simulator"):
            raise ValueError(f"runner {runner!r} is not one of sim, emulator, simulator, device")
        simulator = runner == "simulator" or (runner == "sim" and HAVE_NEURONXCC)
        kwargs = {"kernel": name, "roles": list(side), "grid": grid, "config": dataclasses.asdict(cfg),
                  "simulator": simulator}  # fmt: skip
        out = hostcall.host_call(run_kernel, operands, kwargs, jax.ShapeDtypeStruct(out_shape, out_dtype))
    if return_lse:
        return out[..., :d], out[..., d]
    return out if decode else out[:, :, :t].transpose(0, 2, 1, 3)


def _device_call(name: str, grid: list[int], cfg: KernelConfig, operands: list[jax.Array],
                 roles: list[str]) -> jax.Array:  # fmt: skip
    """nki.jit traced on JAX arrays: with jax-neuronx this emits the AwsNeuronCustomNativeKernel call."""
    if not HAVE_NEURONXCC:
        raise RuntimeError(INSTALL_MESSAGE)
    named = dict(zip(roles, operands[3:], strict=True))
    kernel = _kernel(name, simulator=True)
    return kernel[tuple(grid)](*operands[:3], named.get("bias"), named.get("keep"), cfg=cfg)


def decode_attention(q: jax.Array, k: jax.Array, v: jax.Array, *, scale: float, **kwargs: Any) -> jax.Array:  # noqa: ANN401
    """`attention` for T <= 8 queries against a longer cache (the decode kernel)."""
    if q.ndim != 4 or not is_decode(q.shape[1], k.shape[1]):
        raise ValueError(f"decode_attention takes T <= {DECODE_MAX_T} < S, got q {q.shape}, k {k.shape}")
    return attention(q, k, v, scale=scale, **kwargs)


# ----------------------------------------------------------------------------- lowerings


def shard_cuts(call: CompositeCall) -> Cuts:
    """What one shard's NKI call cuts (hlofuse.shard_local): B, heads and a decode's key sequence."""
    return decode_key_cuts(call)


def key_split(call: CompositeCall, target: str, splits: int) -> RangeSplit:
    """A decode with its key sequence in `splits` ranges, one per shard, each run by the decode kernel with
    `return_lse` (its specs' `key_split`)."""
    per_range = call.operand_types[1][0][1] // splits
    if not is_decode(call.operand_types[0][0][1], per_range):
        raise Unsupported(f"a key range of {per_range} keys per shard is too short for the {target} decode kernel "
                          f"(more than {DECODE_MAX_T})")
    runner = "device" if target == "neuron" else "sim"

    def run_range(q: jax.Array, k: jax.Array, v: jax.Array, lengths: jax.Array, *, scale: float,
                  softcap: float) -> tuple[jax.Array, jax.Array]:
        out: tuple[jax.Array, jax.Array] = attention(q, k, v, scale=scale, softcap=softcap, kv_lengths=lengths,
                                                     runner=runner, return_lse=True)
        return out

    return decode_key_split(call, splits, run_range, "neuron" if runner == "device" else None)



def _lowering(call: CompositeCall, runner: str) -> Lowered:
    """An `hlofuse.attention` composite as the NKI kernels, or Unsupported saying why not."""
    target = "neuron" if runner == "device" else "neuron-sim"
    if runner == "device" and not HAVE_NEURONXCC:
        raise Unsupported(INSTALL_MESSAGE)
    names = {"f32": "float32", "bf16": "bfloat16", "f16": "float16"}
    (q_shape, q_type), (k_shape, k_type), (v_shape, v_type) = call.operand_types[:3]
    attrs = AttentionAttrs.from_dict(call.attributes)
    try:
        check_shapes(q_shape, k_shape, v_shape, [names.get(x, x) for x in (q_type, k_type, v_type)])
        if attrs.layout != "BTNH":
            raise ValueError(f"layout {attrs.layout} is not BTNH")
        if math.isnan(attrs.masked_value) or attrs.masked_value == float("inf"):
            raise ValueError(f"masked_value {attrs.masked_value} is not -inf or finite")
        if attrs.zero_empty_rows and attrs.masked_value > ZERO_EMPTY_ROWS_FILL_LIMIT:
            # zeroing empty rows afterwards is exact only where masked keys already weigh exactly 0
            raise ValueError(f"zero_empty_rows with masked_value {attrs.masked_value:g} above "
                             f"{ZERO_EMPTY_ROWS_FILL_LIMIT:g}")
    except ValueError as reason:
        raise Unsupported(f"the {target} kernel does not take this composite: {reason}") from None

    def kernel(q: jax.Array, k: jax.Array, v: jax.Array, *, zero_empty_rows: bool, **kwargs: Any) -> jax.Array:  # noqa: ANN401
        return zeroed_if_asked(attention(q, k, v, runner=runner, **kwargs), q, k, zero_empty_rows, kwargs)

    return Lowered(attrs.bind_operands(kernel), platforms=("neuron",) if runner == "device" else ())


# target=neuron: the kernels for a Neuron device (needs neuronxcc); else the composite stays, with a remark.
neuron_lowering = functools.partial(_lowering, runner="device")
# target=neuron-sim: the same kernels run on this host, under NKI's simulator or the emulator.
neuron_sim_lowering = functools.partial(_lowering, runner="sim")
# Per-shard calls: B, heads and a decode's key ranges. target=neuron needs the Neuron SDK on this host.
SPECS = (KernelSpec(ATTENTION, "neuron", neuron_lowering, cuts=lambda call, devices: shard_cuts(call),
                    key_split=key_split, unavailable=missing_sdk),
         KernelSpec(ATTENTION, "neuron-sim", neuron_sim_lowering,
                    cuts=lambda call, devices: shard_cuts(call), key_split=key_split))

__all__ = [
    "SPECS",
    "BlockSizes",
    "attention",
    "attention_reference",
    "decode_attention",
    "key_split",
    "missing_sdk",
    "neuron_lowering",
    "neuron_sim_lowering",
    "run_kernel",
    "shard_cuts",
]
