"""A NumPy emulation of exactly the NKI subset hlofuse's kernels use, with the hardware limits enforced.

`neuronx-cc` (which ships `neuronxcc.nki` and its simulator) cannot be installed everywhere, so CI runs
the NKI kernels here. The emulator exposes the same names as the real API, under three namespaces:

    from hlofuse.kernels.nki.emulator import nki, nl, nisa   # nki.jit, nki.language, nki.isa

and anything outside the subset fails loudly (`NkiEmulatorError`, naming the call), as does anything
the hardware cannot do (`NkiLimitError`, naming the limit and the offending values). Limits, for one
NeuronCore-v2 (Trainium1/Inferentia2; NeuronCore-v3 has more SBUF but the same tile rules):

- partition dim of any SBUF/PSUM tile: <= 128 (`nl.tile_size.pmax`).
- SBUF: 24 MiB = 128 partitions x 192 KiB; live tiles may use at most 192 KiB per partition.
- PSUM: 2 MiB = 128 partitions x 16 KiB, as 8 banks of 2 KiB per partition. One tile fits one bank
  (<= 2 KiB per partition, i.e. 512 fp32); each live PSUM tile holds a bank, so at most 8 are live.
- `nisa.nc_matmul(stationary, moving)`: both in SBUF, of one dtype (fp32/bf16/fp16), with the same
  partition (contraction) size <= 128; stationary free size <= 128 (`gemm_stationary_fmax`), moving
  free size <= 512 (`gemm_moving_fmax`). The result is fp32 in PSUM (accumulate with `psum[...] += ...`).
- `nisa.nc_transpose(x)`: x at most 128 x 128; the result is fp32 in PSUM.
- `nl.load` / `nl.store`: HBM <-> SBUF (store may also read PSUM); the first non-scalar index of the HBM
  slice becomes the partition dim.

Liveness follows Python: a tile is live while a Python object refers to it (views share their
base's allocation), which over-approximates the compiler's own allocator slightly.

Elementwise ops compute in float32 (as the engines do) and write SBUF tiles; binary ops broadcast a
free size of 1 against any free size, never the partition dim. Reductions run over free axes only.
"""

from __future__ import annotations

import contextlib
import contextvars
import itertools
import math
import types
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import ml_dtypes
import numpy as np

# ----------------------------------------------------------------------------- limits

PMAX = 128  # partitions
SBUF_PARTITION_BYTES = 192 * 1024  # 24 MiB / 128
PSUM_BANK_BYTES = 2 * 1024  # per partition
PSUM_BANKS = 8  # 16 KiB per partition, 2 MiB in all
GEMM_STATIONARY_FMAX = 128
GEMM_MOVING_FMAX = 512
TRANSPOSE_MAX = 128


class NkiEmulatorError(Exception):
    """The kernel used something outside the emulated NKI subset (or used it wrongly)."""


class NkiLimitError(NkiEmulatorError):
    """The kernel exceeded a NeuronCore hardware limit; the message names the limit and the values."""


# ----------------------------------------------------------------------------- dtypes and buffers

float32 = np.dtype(np.float32)
float16 = np.dtype(np.float16)
bfloat16 = np.dtype(ml_dtypes.bfloat16)
int32 = np.dtype(np.int32)
uint8 = np.dtype(np.uint8)
bool_ = np.dtype(np.bool_)
_MATMUL_DTYPES = (float32, float16, bfloat16)


@dataclass(frozen=True)
class _Buffer:
    name: str

    def __repr__(self) -> str:
        return f"nl.{self.name}"


sbuf = _Buffer("sbuf")
psum = _Buffer("psum")
hbm = _Buffer("hbm")
shared_hbm = _Buffer("shared_hbm")
private_hbm = _Buffer("private_hbm")
_HBM = (hbm, shared_hbm, private_hbm)


# ----------------------------------------------------------------------------- on-chip memory


@dataclass
class _Core:
    """On-chip memory of one NeuronCore while a kernel program runs: live bytes per partition."""

    sbuf_bytes: int = 0
    psum_banks: int = 0
    sbuf_peak: int = 0
    psum_peak: int = 0

    def allocate(self, buffer: _Buffer, shape: tuple[int, ...], dtype: np.dtype) -> Callable[[], None]:
        per_partition = math.prod(shape[1:]) * dtype.itemsize
        if buffer is sbuf:
            if self.sbuf_bytes + per_partition > SBUF_PARTITION_BYTES:
                raise NkiLimitError(
                    f"SBUF overflow: a {shape} {dtype.name} tile needs {per_partition} bytes per partition with "
                    f"{self.sbuf_bytes} live, over the {SBUF_PARTITION_BYTES} bytes per partition "
                    f"(24 MiB / {PMAX} partitions) of a NeuronCore-v2"
                )
            self.sbuf_bytes += per_partition
            self.sbuf_peak = max(self.sbuf_peak, self.sbuf_bytes)

            def free_sbuf() -> None:
                self.sbuf_bytes -= per_partition

            return free_sbuf
        if per_partition > PSUM_BANK_BYTES:
            raise NkiLimitError(
                f"PSUM tile too large: a {shape} {dtype.name} tile needs {per_partition} bytes per partition, over "
                f"one PSUM bank ({PSUM_BANK_BYTES} bytes per partition, 512 fp32)"
            )
        if self.psum_banks + 1 > PSUM_BANKS:
            raise NkiLimitError(
                f"PSUM overflow: a {shape} {dtype.name} tile needs a bank with {self.psum_banks} of {PSUM_BANKS} "
                f"banks live (PSUM is 2 MiB = {PMAX} partitions x {PSUM_BANKS} banks x {PSUM_BANK_BYTES} bytes)"
            )
        self.psum_banks += 1
        self.psum_peak = max(self.psum_peak, self.psum_banks)

        def free_psum() -> None:
            self.psum_banks -= 1

        return free_psum


_core: contextvars.ContextVar[_Core | None] = contextvars.ContextVar("nki_emulator_core", default=None)
_program: contextvars.ContextVar[tuple[int, ...]] = contextvars.ContextVar("nki_emulator_program", default=())
_shared: contextvars.ContextVar[list[HbmTensor] | None] = contextvars.ContextVar("nki_emulator_shared", default=None)
_shared_index: contextvars.ContextVar[list[int]] = contextvars.ContextVar("nki_emulator_shared_index")


def _active_core(what: str) -> _Core:
    core = _core.get()
    if core is None:
        raise NkiEmulatorError(f"{what}: on-chip tiles exist only inside an nki.jit kernel")
    return core


# ----------------------------------------------------------------------------- indexing


@dataclass(frozen=True)
class ds:  # noqa: N801  (nl.ds)
    """nl.ds(start, size): a dynamic slice of `size` elements from `start`."""

    start: int
    size: int


def _normalize_index(index: Any, shape: tuple[int, ...], what: str) -> tuple[tuple[Any, ...], tuple[int, ...]]:  # noqa: ANN401
    """(numpy index, kept dims' sizes) for ints, slices with step 1 and nl.ds; anything else raises."""
    items = index if isinstance(index, tuple) else (index,)
    if any(item is Ellipsis for item in items):
        if items == (Ellipsis,):
            items = (slice(None),) * len(shape)
        else:
            raise NkiEmulatorError(f"{what}: only a lone `...` index is emulated, got {index!r}")
    if len(items) > len(shape):
        raise NkiEmulatorError(f"{what}: {len(items)} indices into a rank-{len(shape)} tensor")
    items = items + (slice(None),) * (len(shape) - len(items))
    out: list[Any] = []
    kept: list[int] = []
    for item, size in zip(items, shape, strict=True):
        if isinstance(item, ds):
            item = slice(item.start, item.start + item.size)
        if isinstance(item, (int, np.integer)):
            if not 0 <= item < size:
                raise NkiEmulatorError(f"{what}: index {item} out of bounds for a dim of size {size}")
            out.append(int(item))
        elif isinstance(item, slice):
            start, stop, step = item.indices(size)
            if step != 1 or (item.stop is not None and item.stop > size) or (item.start or 0) < 0:
                raise NkiEmulatorError(f"{what}: slice {item} out of bounds or strided for a dim of size {size}")
            out.append(slice(start, stop))
            kept.append(max(0, stop - start))
        else:
            raise NkiEmulatorError(f"{what}: index {item!r} is outside the emulated subset (int, slice, nl.ds)")
    return tuple(out), tuple(kept)


def _check_partition(shape: tuple[int, ...], what: str) -> None:
    if len(shape) < 2:
        raise NkiEmulatorError(f"{what}: tiles are (partition, free...) with rank >= 2, got shape {shape}")
    if not 1 <= shape[0] <= PMAX:
        raise NkiLimitError(f"{what}: partition dim {shape[0]} of tile {shape} exceeds the {PMAX} partitions")


# ----------------------------------------------------------------------------- tensors and tiles


class HbmTensor:
    """A tensor in device memory (HBM): only nl.load, nl.store and indexing touch it."""

    def __init__(self, array: np.ndarray, buffer: _Buffer = hbm) -> None:
        self.array = array
        self.buffer = buffer

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.array.shape)

    @property
    def dtype(self) -> np.dtype:
        return self.array.dtype

    def __getitem__(self, index: Any) -> _HbmSlice:  # noqa: ANN401
        np_index, kept = _normalize_index(index, self.shape, "HBM index")
        return _HbmSlice(self, np_index, kept)

    def __array__(self) -> np.ndarray:
        raise NkiEmulatorError("an HBM tensor cannot be computed on directly: nl.load it into SBUF first")


@dataclass(frozen=True)
class _HbmSlice:
    tensor: HbmTensor
    index: tuple[Any, ...]
    shape: tuple[int, ...]


class _Allocation:
    """One on-chip allocation, freed when the last tile (or view) referring to it is collected."""

    def __init__(self, buffer: _Buffer, shape: tuple[int, ...], dtype: np.dtype, what: str) -> None:
        _check_partition(shape, what)
        weakref.finalize(self, _active_core(what).allocate(buffer, shape, dtype))


class Tile:
    """An on-chip tile in SBUF or PSUM: partition dim first (<= 128), then free dims."""

    def __init__(self, data: np.ndarray, buffer: _Buffer, what: str, base: _Allocation | None = None) -> None:
        if buffer not in (sbuf, psum):
            raise NkiEmulatorError(f"{what}: tiles live in nl.sbuf or nl.psum, not {buffer}")
        self.data = data
        self.buffer = buffer
        self._allocation = base or _Allocation(buffer, tuple(data.shape), data.dtype, what)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.data.shape)

    @property
    def dtype(self) -> np.dtype:
        return self.data.dtype

    def __getitem__(self, index: Any) -> Tile:  # noqa: ANN401
        np_index, kept = _normalize_index(index, self.shape, "tile index")
        if not isinstance(np_index[0], slice):
            raise NkiEmulatorError("tile index: the partition dim must be sliced, not indexed (keep it first)")
        view = self.data[np_index]
        _check_partition(tuple(view.shape), "tile index")
        return Tile(view, self.buffer, "tile index", base=self._allocation)

    def __setitem__(self, index: Any, value: Tile | float) -> None:  # noqa: ANN401
        np_index, kept = _normalize_index(index, self.shape, "tile assignment")
        target = self.data[np_index]
        source = value.data if isinstance(value, Tile) else np.asarray(value)
        if isinstance(value, Tile) and value.data is target:
            return  # `t[...] += x` writes the view back onto itself
        if isinstance(value, Tile) and tuple(source.shape) != tuple(target.shape):
            raise NkiEmulatorError(f"tile assignment: a {source.shape} tile into a {target.shape} region")
        self.data[np_index] = source.astype(self.dtype)

    def __iadd__(self, other: Tile) -> Tile:
        """`psum_tile[...] += nisa.nc_matmul(...)`: accumulation in PSUM, in fp32."""
        if self.buffer is not psum or self.dtype != float32:
            raise NkiEmulatorError(
                f"+= accumulates into fp32 PSUM tiles only, not a {self.dtype.name} {self.buffer} tile"
            )
        if not isinstance(other, Tile) or other.shape != self.shape:
            raise NkiEmulatorError(f"+= needs a tile of shape {self.shape}, got {getattr(other, 'shape', other)}")
        self.data += other.data.astype(float32)
        return self

    def __array__(self) -> np.ndarray:
        raise NkiEmulatorError("tiles are computed on with nl.* / nisa.* calls, not as NumPy arrays")

    def __repr__(self) -> str:
        return f"Tile({self.shape}, {self.dtype.name}, {self.buffer})"


def _new_tile(data: np.ndarray, buffer: _Buffer, what: str) -> Tile:
    return Tile(np.ascontiguousarray(data), buffer, what)


# ----------------------------------------------------------------------------- nki.language


@dataclass(frozen=True)
class _TileSize:
    pmax: int = PMAX
    psum_fmax: int = PSUM_BANK_BYTES // 4
    gemm_stationary_fmax: int = GEMM_STATIONARY_FMAX
    gemm_moving_fmax: int = GEMM_MOVING_FMAX


tile_size = _TileSize()


def _dtype(dtype: Any) -> np.dtype:  # noqa: ANN401
    return np.dtype(dtype)


def ndarray(shape: Sequence[int], dtype: Any, buffer: _Buffer = sbuf) -> Tile | HbmTensor:  # noqa: ANN401
    """nl.ndarray: an uninitialized tensor (floats start as NaN, so reading before writing shows)."""
    shape = tuple(int(s) for s in shape)
    dt = _dtype(dtype)
    fill = np.nan if np.issubdtype(dt, np.floating) or dt == bfloat16 else 0
    data = np.full(shape, fill, dtype=dt)
    if buffer in _HBM:
        if buffer is shared_hbm:
            return _shared_tensor(data)
        return HbmTensor(data, buffer)
    return _new_tile(data, buffer, "nl.ndarray")


def _shared_tensor(data: np.ndarray) -> HbmTensor:
    """Every program of a launch grid sees the same shared_hbm tensors, matched by allocation order."""
    shared, counter = _shared.get(), _shared_index.get(None)
    if shared is None or counter is None:
        return HbmTensor(data, shared_hbm)
    i = counter[0]
    counter[0] += 1
    if i == len(shared):
        shared.append(HbmTensor(data, shared_hbm))
    elif shared[i].shape != data.shape or shared[i].dtype != data.dtype:
        raise NkiEmulatorError("programs of one grid allocated different shared_hbm tensors")
    return shared[i]


def zeros(shape: Sequence[int], dtype: Any, buffer: _Buffer = sbuf) -> Tile:  # noqa: ANN401
    return full(shape, 0, dtype, buffer)


def full(shape: Sequence[int], fill_value: float, dtype: Any, buffer: _Buffer = sbuf) -> Tile:  # noqa: ANN401
    if buffer in _HBM:
        raise NkiEmulatorError("nl.full / nl.zeros make on-chip tiles (nl.sbuf or nl.psum), not HBM tensors")
    return _new_tile(np.full(tuple(shape), fill_value, dtype=_dtype(dtype)), buffer, "nl.full")


def load(src: _HbmSlice | HbmTensor, dtype: Any = None) -> Tile:  # noqa: ANN401
    """HBM -> SBUF. The slice's first kept dim becomes the partition dim."""
    if isinstance(src, HbmTensor):
        src = src[...]
    if not isinstance(src, _HbmSlice):
        raise NkiEmulatorError(f"nl.load reads an HBM tensor (or a slice of one), not {type(src).__name__}")
    data = src.tensor.array[src.index]
    _check_partition(tuple(data.shape), "nl.load")
    return _new_tile(data.astype(_dtype(dtype)) if dtype is not None else data, sbuf, "nl.load")


def store(dst: _HbmSlice | HbmTensor, value: Tile) -> None:
    """SBUF (or PSUM) -> HBM, cast to the destination's dtype."""
    if isinstance(dst, HbmTensor):
        dst = dst[...]
    if not isinstance(dst, _HbmSlice):
        raise NkiEmulatorError(f"nl.store writes an HBM tensor slice, not {type(dst).__name__}")
    if not isinstance(value, Tile):
        raise NkiEmulatorError(f"nl.store stores an on-chip tile, not {type(value).__name__}")
    if value.shape != dst.shape:
        raise NkiEmulatorError(f"nl.store: a {value.shape} tile into a {dst.shape} HBM region")
    dst.tensor.array[dst.index] = value.data.astype(dst.tensor.dtype)


def copy(x: Tile, dtype: Any = None) -> Tile:  # noqa: ANN401
    """A copy into SBUF, cast to `dtype` (PSUM -> SBUF evacuation, or a downcast)."""
    _need_tile(x, "nl.copy")
    return _new_tile(x.data.astype(_dtype(dtype) if dtype is not None else x.dtype), sbuf, "nl.copy")


def _need_tile(x: Any, what: str) -> None:  # noqa: ANN401
    if isinstance(x, HbmTensor | _HbmSlice):
        raise NkiEmulatorError(f"{what}: operands must be on-chip tiles; nl.load the HBM tensor first")
    if not isinstance(x, Tile):
        raise NkiEmulatorError(f"{what}: expected a tile, got {type(x).__name__}")


def _operand(x: Tile | float | bool, what: str) -> np.ndarray:
    if isinstance(x, (int, float, bool, np.number)):
        return np.asarray(x, dtype=float32 if not isinstance(x, bool) else bool_)
    _need_tile(x, what)
    return x.data if x.dtype in (bool_, int32, uint8) else x.data.astype(float32)


def _broadcast(a: Tile | float, b: Tile | float, what: str) -> tuple[int, ...]:
    shapes = [x.shape for x in (a, b) if isinstance(x, Tile)]
    if len(shapes) == 2:
        sa, sb = shapes
        if len(sa) != len(sb) or sa[0] != sb[0]:
            raise NkiEmulatorError(f"{what}: tiles {sa} and {sb} must share the partition dim (no partition broadcast)")
        for x, y in zip(sa[1:], sb[1:], strict=True):
            if x != y and 1 not in (x, y):
                raise NkiEmulatorError(f"{what}: free dims of {sa} and {sb} do not broadcast")
        return tuple(max(x, y) for x, y in zip(sa, sb, strict=True))
    if not shapes:
        raise NkiEmulatorError(f"{what}: at least one operand must be a tile")
    return shapes[0]


def _elementwise(name: str, fn: Callable[..., np.ndarray], out_dtype: np.dtype | None = None) -> Callable[..., Tile]:
    def op(*args: Tile | float, dtype: Any = None) -> Tile:  # noqa: ANN401
        what = f"nl.{name}"
        if len(args) == 2:
            _broadcast(args[0], args[1], what)
        values = [_operand(a, what) for a in args]
        with np.errstate(all="ignore"):
            result = fn(*values)
        result_dtype = _dtype(dtype) if dtype is not None else (out_dtype or float32)
        return _new_tile(np.asarray(result).astype(result_dtype), sbuf, what)

    op.__name__ = name
    return op


exp = _elementwise("exp", np.exp)
log = _elementwise("log", np.log)
tanh = _elementwise("tanh", np.tanh)
add = _elementwise("add", np.add)
subtract = _elementwise("subtract", np.subtract)
multiply = _elementwise("multiply", np.multiply)
divide = _elementwise("divide", np.divide)
maximum = _elementwise("maximum", np.maximum)
minimum = _elementwise("minimum", np.minimum)
equal = _elementwise("equal", np.equal, bool_)
not_equal = _elementwise("not_equal", np.not_equal, bool_)
greater = _elementwise("greater", np.greater, bool_)
less = _elementwise("less", np.less, bool_)
less_equal = _elementwise("less_equal", np.less_equal, bool_)
greater_equal = _elementwise("greater_equal", np.greater_equal, bool_)
logical_and = _elementwise("logical_and", np.logical_and, bool_)
logical_or = _elementwise("logical_or", np.logical_or, bool_)


def where(condition: Tile, x: Tile | float, y: Tile | float, dtype: Any = None) -> Tile:  # noqa: ANN401
    _need_tile(condition, "nl.where")
    for operand in (x, y):
        if isinstance(operand, Tile):
            _broadcast(condition, operand, "nl.where")
    cond = condition.data.astype(bool_)
    result = np.where(cond, _operand(x, "nl.where"), _operand(y, "nl.where"))
    return _new_tile(result.astype(_dtype(dtype) if dtype is not None else float32), sbuf, "nl.where")


def _reduction(name: str, fn: Callable[..., np.ndarray]) -> Callable[..., Tile]:
    def op(x: Tile, axis: int | Sequence[int], dtype: Any = None, keepdims: bool = False) -> Tile:  # noqa: ANN401
        what = f"nl.{name}"
        _need_tile(x, what)
        axes = (axis,) if isinstance(axis, int) else tuple(axis)
        if any(a % len(x.shape) == 0 for a in axes):
            raise NkiEmulatorError(f"{what}: reductions run over free axes only, not the partition axis (axis={axis})")
        result = fn(_operand(x, what), axis=axes, keepdims=keepdims)
        return _new_tile(result.astype(_dtype(dtype) if dtype is not None else float32), sbuf, what)

    op.__name__ = name
    return op


reduce_max = _reduction("max", np.max)  # nl.max (named so the builtin max stays usable here)
reduce_min = _reduction("min", np.min)  # nl.min
reduce_sum = _reduction("sum", np.sum)  # nl.sum


def affine_range(*args: int) -> range:
    """Iterations without loop-carried dependencies (the compiler may reorder or pipeline them)."""
    return range(*args)


def sequential_range(*args: int) -> range:
    """Iterations that carry state from one to the next (online softmax)."""
    return range(*args)


def static_range(*args: int) -> range:
    """A loop unrolled at trace time: its index is a Python int."""
    return range(*args)


def program_id(axis: int) -> int:
    grid = _program.get()
    if not 0 <= axis < len(grid):
        raise NkiEmulatorError(f"nl.program_id({axis}) outside a launch grid of rank {len(grid)}")
    return grid[axis]


class _Affine:
    """An affine expression of nl.arange indices, for nisa.iota."""

    def __init__(self, values: np.ndarray) -> None:
        self.values = values

    def __getitem__(self, index: Any) -> _Affine:  # noqa: ANN401
        return _Affine(self.values[index])

    def _combine(self, other: _Affine | int, fn: Callable[[Any, Any], np.ndarray]) -> _Affine:
        if isinstance(other, _Affine):
            return _Affine(fn(self.values, other.values))
        if isinstance(other, (int, np.integer)):
            return _Affine(fn(self.values, int(other)))
        raise NkiEmulatorError(f"affine index expressions combine with ints only, not {type(other).__name__}")

    def __add__(self, other: _Affine | int) -> _Affine:
        return self._combine(other, np.add)

    __radd__ = __add__

    def __sub__(self, other: _Affine | int) -> _Affine:
        return self._combine(other, np.subtract)

    def __rsub__(self, other: int) -> _Affine:
        return self._combine(other, lambda a, b: b - a)

    def __mul__(self, other: int) -> _Affine:
        if isinstance(other, _Affine):
            raise NkiEmulatorError("affine index expressions cannot multiply two indices")
        return self._combine(other, np.multiply)

    __rmul__ = __mul__


def arange(n: int) -> _Affine:
    return _Affine(np.arange(int(n), dtype=np.int64))


# ----------------------------------------------------------------------------- nki.isa


def nc_matmul(stationary: Tile, moving: Tile) -> Tile:
    """TensorE: stationary (K, M)ᵀ @ moving (K, N) -> (M, N) fp32 in PSUM."""
    _need_tile(stationary, "nisa.nc_matmul")
    _need_tile(moving, "nisa.nc_matmul")
    for name, t in (("stationary", stationary), ("moving", moving)):
        if t.buffer is not sbuf:
            raise NkiEmulatorError(f"nisa.nc_matmul: the {name} operand must be in SBUF, not {t.buffer}")
        if len(t.shape) != 2:
            raise NkiEmulatorError(f"nisa.nc_matmul: the {name} operand must be 2-D, got {t.shape}")
        if t.dtype not in _MATMUL_DTYPES:
            raise NkiEmulatorError(f"nisa.nc_matmul: {name} dtype {t.dtype.name} is not one of fp32/bf16/fp16")
    (k1, m), (k2, n) = stationary.shape, moving.shape
    if k1 != k2:
        raise NkiEmulatorError(f"nisa.nc_matmul: contraction (partition) sizes differ: stationary {k1}, moving {k2}")
    if stationary.dtype != moving.dtype:
        raise NkiEmulatorError(f"nisa.nc_matmul: operand dtypes differ ({stationary.dtype.name}, {moving.dtype.name})")
    if m > GEMM_STATIONARY_FMAX:
        raise NkiLimitError(
            f"nisa.nc_matmul: stationary free size {m} exceeds gemm_stationary_fmax {GEMM_STATIONARY_FMAX} "
            f"(stationary {stationary.shape})"
        )
    if n > GEMM_MOVING_FMAX:
        raise NkiLimitError(
            f"nisa.nc_matmul: moving free size {n} exceeds gemm_moving_fmax {GEMM_MOVING_FMAX} (moving {moving.shape})"
        )
    result = stationary.data.astype(float32).T @ moving.data.astype(float32)
    return _new_tile(result.astype(float32), psum, "nisa.nc_matmul")


def nc_transpose(x: Tile) -> Tile:
    """TensorE transpose (a matmul against the identity): (P, F) -> (F, P) fp32 in PSUM, both <= 128."""
    _need_tile(x, "nisa.nc_transpose")
    if len(x.shape) != 2 or x.shape[1] > TRANSPOSE_MAX:
        raise NkiLimitError(f"nisa.nc_transpose: tile {x.shape} exceeds {TRANSPOSE_MAX} x {TRANSPOSE_MAX}")
    return _new_tile(x.data.astype(float32).T, psum, "nisa.nc_transpose")


def iota(expr: _Affine, dtype: Any) -> Tile:  # noqa: ANN401
    """GpSimd iota: a tile of the affine index expression's values, in SBUF."""
    if not isinstance(expr, _Affine):
        raise NkiEmulatorError(f"nisa.iota takes an affine expression of nl.arange indices, not {type(expr).__name__}")
    return _new_tile(expr.values.astype(_dtype(dtype)), sbuf, "nisa.iota")


# ----------------------------------------------------------------------------- nki.jit


@dataclass
class LaunchStats:
    """Peak on-chip use of the last launch (bytes per partition of SBUF, banks of PSUM)."""

    sbuf_peak_bytes: int = 0
    psum_peak_banks: int = 0
    programs: int = 0


@dataclass
class EmulatedKernel:
    """An nki.jit kernel under the emulator: `kernel(*args)` or `kernel[grid](*args)` on NumPy arrays."""

    fn: Callable[..., Any]
    grid: tuple[int, ...] = ()
    stats: LaunchStats = field(default_factory=LaunchStats)

    def __getitem__(self, grid: int | tuple[int, ...]) -> EmulatedKernel:
        grid = (grid,) if isinstance(grid, int) else tuple(grid)
        return EmulatedKernel(self.fn, grid, self.stats)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:  # noqa: ANN401
        wrapped = [HbmTensor(np.asarray(a)) if isinstance(a, np.ndarray) else a for a in args]
        shared: list[HbmTensor] = []
        result: Any = None
        self.stats.sbuf_peak_bytes = self.stats.psum_peak_banks = self.stats.programs = 0
        for pid in itertools.product(*(range(g) for g in self.grid)):
            core = _Core()
            with _context(core, pid, shared):
                result = self.fn(*wrapped, **kwargs)
                del core  # the program's tiles die with its frame
            self.stats.programs += 1
        return _unwrap(result)


@contextlib.contextmanager
def _context(core: _Core, pid: tuple[int, ...], shared: list[HbmTensor]) -> Iterator[None]:
    tokens = (_core.set(core), _program.set(pid), _shared.set(shared), _shared_index.set([0]))
    stats_core = core
    try:
        yield
    finally:
        _core.reset(tokens[0])
        _program.reset(tokens[1])
        _shared.reset(tokens[2])
        _shared_index.reset(tokens[3])
        _last_cores.append(stats_core)
        del _last_cores[:-1]


_last_cores: list[_Core] = []


def last_core_peaks() -> tuple[int, int]:
    """(peak SBUF bytes per partition, peak PSUM banks) of the last program run."""
    core = _last_cores[-1] if _last_cores else _Core()
    return core.sbuf_peak, core.psum_peak


def _unwrap(result: Any) -> Any:  # noqa: ANN401
    if isinstance(result, HbmTensor):
        return result.array
    if isinstance(result, tuple):
        return tuple(_unwrap(r) for r in result)
    if isinstance(result, Tile):
        raise NkiEmulatorError("a kernel returns HBM tensors (nl.ndarray(..., buffer=nl.shared_hbm)), not tiles")
    return result


def jit(fn: Callable[..., Any] | None = None, **options: Any) -> Any:  # noqa: ANN401
    """nki.jit: `@nki.jit` or `@nki.jit(...)` (options are accepted and ignored by the emulator)."""
    if fn is None:
        return lambda f: EmulatedKernel(f)
    return EmulatedKernel(fn)


# ----------------------------------------------------------------------------- the namespaces


class _Namespace(types.SimpleNamespace):
    """A module-like namespace whose unknown attributes raise a clear subset error."""

    def __getattr__(self, name: str) -> Any:  # noqa: ANN401
        if name.startswith("__"):
            raise AttributeError(name)
        raise NkiEmulatorError(
            f"{self._prefix}.{name} is not in hlofuse's NKI emulator subset "
            "(python/hlofuse/kernels/nki/emulator.py); add it there, with its hardware limits, before using it"
        )


def _namespace(prefix: str, names: dict[str, Any], **more: Any) -> _Namespace:  # noqa: ANN401
    ns = _Namespace(**names, **more)
    object.__setattr__(ns, "_prefix", prefix)
    return ns


nl = _namespace("nl", {name: globals()[name] for name in (
    "float32", "float16", "bfloat16", "int32", "uint8", "bool_", "sbuf", "psum", "hbm", "shared_hbm",
    "private_hbm", "tile_size", "ndarray", "zeros", "full", "load", "store", "copy", "exp", "log", "tanh", "add",
    "subtract", "multiply", "divide", "maximum", "minimum", "equal", "not_equal", "less", "less_equal", "greater",
    "greater_equal", "logical_and", "logical_or", "where", "affine_range", "sequential_range", "static_range",
    "program_id", "arange", "ds",
)}, max=reduce_max, min=reduce_min, sum=reduce_sum)  # fmt: skip
nisa = _namespace("nisa", {"nc_matmul": nc_matmul, "nc_transpose": nc_transpose, "iota": iota})
nki = _namespace("nki", {"jit": jit, "language": nl, "isa": nisa})

__all__ = ["EmulatedKernel", "HbmTensor", "NkiEmulatorError", "NkiLimitError", "Tile", "nisa", "nki", "nl"]
