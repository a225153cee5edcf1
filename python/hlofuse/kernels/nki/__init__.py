"""NKI kernels for AWS Trainium / Inferentia (NeuronCore-v2+), and the NumPy emulator CI runs them under.

`attention.py` holds the kernels and their JAX-side wrapper, `emulator.py` the emulated NKI subset,
`hostcall.py` the CPU custom call through which target=neuron-sim runs them. docs/kernels-nki.md has
the constraints and the emulator's limits.
"""
