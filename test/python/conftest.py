"""Shared pytest set-up for test/python: the source checkout stands in for an installed hlofuse.

Like tools/hlofuse-opt: <repo>/python goes on sys.path and `hlofuse.passes` becomes <repo>/passes (an
installed wheel maps it there through scikit-build-core's wheel.packages table).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

if importlib.util.find_spec("hlofuse") is None:
    sys.path.insert(0, str(REPO / "python"))
    passes_init = REPO / "passes" / "__init__.py"
    if passes_init.is_file() and "hlofuse.passes" not in sys.modules:
        import hlofuse

        spec = importlib.util.spec_from_file_location(
            "hlofuse.passes", passes_init, submodule_search_locations=[str(REPO / "passes")]
        )
        assert spec is not None and spec.loader is not None
        passes = importlib.util.module_from_spec(spec)
        sys.modules["hlofuse.passes"] = passes
        spec.loader.exec_module(passes)
        hlofuse.passes = passes  # type: ignore[attr-defined]
