"""Thin, version-pinned helpers over jaxlib's MLIR bindings: contexts, matching, building."""
