"""Compute kernels, one module per operation and device; they trust their (validated) input."""
