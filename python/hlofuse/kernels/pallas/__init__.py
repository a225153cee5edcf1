"""Pallas kernels for TPU (Mosaic) and GPU (Triton): attention.py is the public entry point."""
