"""Shared pytest set-up for test/python: makes the source tree importable when hlofuse is not installed."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

if importlib.util.find_spec("hlofuse") is None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))
