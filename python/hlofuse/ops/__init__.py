"""The composite contract: one module per composite hlofuse raises.

`attention` (`hlofuse.attention`) and `sample` (`hlofuse.sample`) each hold the composite's name, version and
attribute dataclass, which reads the attributes back from IR so that every pass, kernel and test interprets a
composite in one way. `attributes` turns a composite's attribute dictionary into Python values.
docs/composites.md documents the same fields.
"""
