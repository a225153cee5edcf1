"""Where hlofuse keeps what it computes once per machine or install: one folder for every cache.

    HLOFUSE_CACHE_DIR   the folder (default ~/.cache/hlofuse); "off" (or empty, "0", "none") turns every cache off

The sampling pass's lowered templates (`hlofuse.template_cache`) and hlofuse-report's host measurements
(`hlofuse.report.hardware.host_calibration`) live there.
"""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "HLOFUSE_CACHE_DIR"


def cache_root() -> Path | None:
    """The cache folder, or None where HLOFUSE_CACHE_DIR turns caching off."""
    configured = os.environ.get(CACHE_ENV)
    if configured is not None:
        return None if configured.strip().lower() in ("", "off", "0", "none") else Path(configured)
    return Path.home() / ".cache" / "hlofuse"
