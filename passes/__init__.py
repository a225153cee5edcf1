"""hlofuse's passes, one module each; `hlofuse.pipeline.PASS_CLASSES` maps their names to classes."""
