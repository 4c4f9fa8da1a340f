"""asv benchmarks of pysparse_hpc (run from ``asv_bench/``: ``asv run``, ``asv continuous``)."""
