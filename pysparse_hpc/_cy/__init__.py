"""Compiled Cython extensions (built from ``src_cython/``); private, use the public API."""
