"""hlofuse.template_cache: lowered texts kept on disk per install, and the sampling pass reading them back."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
from hlofuse.passes import fuse_sampling

from hlofuse import template_cache
from hlofuse.pipeline import run_pipeline
from hlofuse.testing import clone_module


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(template_cache.CACHE_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache"


def _counting(text: str) -> tuple[list[int], object]:
    calls: list[int] = []

    def compute() -> str:
        calls.append(1)
        return text

    return calls, compute


def test_a_text_is_computed_once_per_key(cache_dir: Path) -> None:
    calls, compute = _counting("module {}")
    assert template_cache.cached_text("sample", ("a", (2, 16)), compute) == "module {}"
    assert template_cache.cached_text("sample", ("a", (2, 16)), compute) == "module {}"
    assert len(calls) == 1
    template_cache.cached_text("sample", ("a", (2, 17)), compute)  # another key
    assert len(calls) == 2
    assert len(list((cache_dir / template_cache.fingerprint()).glob("sample-*.mlir"))) == 2


@pytest.mark.parametrize("setting", ["off", ""])
def test_off_computes_every_time(monkeypatch: pytest.MonkeyPatch, setting: str) -> None:
    monkeypatch.setenv(template_cache.CACHE_ENV, setting)
    assert template_cache.cache_root() is None
    calls, compute = _counting("module {}")
    for _ in range(2):
        template_cache.cached_text("sample", ("a",), compute)
    assert len(calls) == 2


def test_an_unwritable_directory_computes_as_without_a_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "file").write_text("not a directory")
    monkeypatch.setenv(template_cache.CACHE_ENV, str(tmp_path / "file" / "cache"))
    calls, compute = _counting("module {}")
    for _ in range(2):
        assert template_cache.cached_text("sample", ("a",), compute) == "module {}"
    assert len(calls) == 2


def test_stale_installs_are_pruned(cache_dir: Path) -> None:
    current = template_cache.fingerprint()
    cache_dir.mkdir()
    stale = [cache_dir / f"{i:0{len(current)}d}" for i in range(5)]
    for age, directory in enumerate(stale):
        directory.mkdir()
        os.utime(directory, (1e9 - age, 1e9 - age))  # stale[0] the newest
    (cache_dir / "notes").mkdir()  # not an install's directory: left alone
    template_cache._directory(cache_dir, current)
    kept = sorted(d.name for d in cache_dir.iterdir())
    assert kept == sorted([current, "notes", *(d.name for d in stale[:template_cache.KEEP_FINGERPRINTS - 1])])


def test_threads_read_whole_texts(cache_dir: Path) -> None:
    text = "x" * 200_000
    results: list[str] = []

    def run() -> None:
        for i in range(20):
            results.append(template_cache.cached_text("sample", (i % 3,), lambda: text))

    threads = [threading.Thread(target=run) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(results) == 80 and set(results) == {text}
    assert not list((cache_dir / template_cache.fingerprint()).glob(".tmp-*"))


def _fused(cache: str, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv(template_cache.CACHE_ENV, cache)
    fuse_sampling._template_text.cache_clear()  # the process's own cache: each run reads the disk (or lowers)
    fuse_sampling._prelude_text.cache_clear()

    def sample(logits: jax.Array, key: jax.Array) -> jax.Array:
        return jax.random.categorical(key, jax.nn.log_softmax(logits / 0.7), axis=-1)

    args = (jax.ShapeDtypeStruct((3, 97), jnp.float32), jax.ShapeDtypeStruct((2,), jnp.uint32))
    module = clone_module(jax.jit(sample).lower(*args).compiler_ir("stablehlo"))
    run_pipeline(module, "builtin.module(hlofuse-prepare,hlofuse-fuse-sampling)")
    return str(module)


def test_the_pass_fuses_alike_from_the_cache(cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    without = _fused("off", monkeypatch)
    assert 'stablehlo.composite "hlofuse.sample"' in without
    written = _fused(str(cache_dir), monkeypatch)
    assert list((cache_dir / template_cache.fingerprint()).glob("sample-*.mlir"))
    read_back = _fused(str(cache_dir), monkeypatch)
    assert without == written == read_back


def test_the_ops_a_writing_requires_are_kept_with_the_templates(cache_dir: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """`_required_ops` (which writings a program could match, read from a trace) is kept on disk: a later process
    reads it back without tracing, and a writing whose trace raised raises ValueError again."""
    fuse_sampling._required_ops.cache_clear()
    required = fuse_sampling._required_ops("top_p_descending_mask", 0, (2, 64), "f32", 0)
    with pytest.raises(ValueError, match="untraceable|ValueError|takes"):
        fuse_sampling._required_ops("top_p_ascending_mask", 0, (2, 3, 64), "f32", 0)  # (B, V) or (V,) only
    assert len(list((cache_dir / template_cache.fingerprint()).glob("required-ops-*.mlir"))) == 2

    def no_trace(*_: object, **__: object) -> None:
        raise AssertionError("traced again")

    fuse_sampling._required_ops.cache_clear()
    monkeypatch.setattr(fuse_sampling, "_traced", no_trace)
    assert fuse_sampling._required_ops("top_p_descending_mask", 0, (2, 64), "f32", 0) == required
    assert "stablehlo.sort" in required
    with pytest.raises(ValueError):
        fuse_sampling._required_ops("top_p_ascending_mask", 0, (2, 3, 64), "f32", 0)
    fuse_sampling._required_ops.cache_clear()
