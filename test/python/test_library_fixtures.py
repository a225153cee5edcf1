"""The real-library attention corpus (test/fixtures/libraries) through the default pipeline.

For each module of the manifest: the default pipeline (no kernel lowering) must raise exactly
`expected_fused` attention composites, and the rewritten module must compute what the original does on
the manifest's deterministic inputs. The fixtures come from tools/fixtures/gen_library_modules.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from hlofuse.pipeline import run_pipeline
from hlofuse.testing import (
    assert_outputs_close,
    clone_module,
    count_composites,
    main_func,
    make_inputs,
    parse_module_text,
    run_module,
)
from hlofuse.testing.modules import tensor_spec

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "libraries"
MANIFEST = json.loads((FIXTURES / "manifest.json").read_text())
ENTRIES = {e["name"]: e for e in MANIFEST["modules"]}


def load(name: str):
    return parse_module_text((FIXTURES / ENTRIES[name]["file"]).read_text())


@pytest.mark.parametrize("name", list(ENTRIES))
def test_fixture_matches_manifest(name):
    entry = ENTRIES[name]
    module = load(name)
    main = main_func(module)
    assert [tensor_spec(a.type) for a in main.arguments] == [
        (tuple(i["shape"]), i["dtype"]) for i in entry["inputs"]
    ]
    assert [tensor_spec(t) for t in main.type.results] == [
        (tuple(o["shape"]), o["dtype"]) for o in entry["outputs"]
    ]
    assert count_composites(module, None) == 0
    assert 0 <= entry["expected_fused"] <= entry["expected_attention_sites"]
    outs = run_module(module, make_inputs(entry))
    assert all(np.isfinite(o.astype(np.float32)).all() for o in outs)


@pytest.mark.parametrize("name", list(ENTRIES))
def test_default_pipeline_fuses_and_preserves_outputs(name):
    entry = ENTRIES[name]
    original = load(name)
    rewritten = clone_module(original)
    result = run_pipeline(rewritten, "default")
    fused = count_composites(rewritten)
    assert fused == entry["expected_fused"], (
        f"{name}: {fused} hlofuse.attention composites, expected {entry['expected_fused']} "
        f"({entry['expected_attention_sites']} sites); counters {dict(result.counters)}; "
        f"remarks {result.remarks}"
    )
    args = make_inputs(entry)
    assert_outputs_close(run_module(original, args), run_module(rewritten, args))
