"""Test helpers shared across the repo: run StableHLO modules, regenerate fixture inputs, compare outputs."""

from hlofuse.testing.modules import (
    TOLERANCES,
    assert_outputs_close,
    clone_module,
    count_composites,
    main_func,
    make_inputs,
    parse_module_text,
    run_module,
)

__all__ = [
    "TOLERANCES",
    "assert_outputs_close",
    "clone_module",
    "count_composites",
    "main_func",
    "make_inputs",
    "parse_module_text",
    "run_module",
]
