"""The slow-test table in test/conftest.py names tests that exist, so --fast never keeps a test by accident."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _tiers():  # test/conftest.py, loaded under its own name ("conftest" is also test/python/conftest.py)
    spec = importlib.util.spec_from_file_location("hlofuse_test_tiers", REPO / "test" / "conftest.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


TIERS = _tiers()


@pytest.mark.parametrize("key", sorted(TIERS.SLOW))
def test_slow_entry_names_a_test(key):
    path, *names = key.partition("[")[0].split("::")
    file = REPO / path
    assert file.is_file(), f"SLOW entry {key}: no file {path}"
    assert TIERS.SLOW[key].strip(), f"SLOW entry {key} says not why it is slow"
    text = file.read_text()
    for name in names:
        assert re.search(rf"^\s*(?:async\s+)?(?:def|class)\s+{re.escape(name)}\b", text, re.M), (
            f"SLOW entry {key}: {path} defines no {name}")


@pytest.mark.parametrize("sample", sorted(TIERS.FAST_SAMPLES))
def test_fast_sample_is_under_a_slow_entry(sample):
    assert "[" in sample, f"FAST_SAMPLES entry {sample} is not one parametrization"
    covering = [k for k in TIERS.SLOW if sample.startswith((k + "::", k + "["))]
    assert covering, f"FAST_SAMPLES entry {sample} is under no SLOW entry, so it is in the fast tier anyway"
    assert TIERS.slow_reason(sample) is None


def test_prefixes_match_whole_names():
    key = "test/python/test_sharding.py::test_sharded_case"
    assert key in TIERS.SLOW
    assert TIERS.slow_reason(key + "[gqa_kv_heads_sharded]") is not None
    assert TIERS.slow_reason(key + "s_other") is None
    assert TIERS.slow_reason("test/python/test_demo.py::test_anything") is not None  # a whole module
    assert TIERS.slow_reason("test/python/test_demo_other.py::test_x") is None
