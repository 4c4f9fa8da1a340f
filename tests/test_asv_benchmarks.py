"""Every asv benchmark runs: its ``setup`` and each timed method once, as asv calls them.

asv runs the suite only on request (``asv run``), so a benchmark broken by a change of the
library would go unnoticed until then. Each benchmark class runs over a covering set of its
parameters (every value of every parameter at least once), not their whole product.
"""
import importlib
import inspect
import sys

import pytest

from .conftest import REPO_ROOT

ASV_ROOT = REPO_ROOT / "asv_bench"
MODULES = sorted(path.stem for path in (ASV_ROOT / "benchmarks").glob("bench_*.py"))
#: The method prefixes asv times or tracks.
BENCHMARK_PREFIXES = ("time_", "peakmem_", "mem_", "track_", "timeraw_")


def _benchmark_classes(module):
    return [cls for _, cls in inspect.getmembers(module, inspect.isclass)
            if cls.__module__ == module.__name__
            and any(name.startswith(BENCHMARK_PREFIXES) for name in dir(cls))]


def _covering(params):
    """Parameter tuples in which every value of every parameter appears at least once."""
    if not params:
        return [()]
    if not isinstance(params[0], list):  # one parameter given as a flat list
        params = [params]
    longest = max(len(values) for values in params)
    return [tuple(values[min(i, len(values) - 1)] for values in params) for i in range(longest)]


@pytest.fixture
def asv_suite(monkeypatch):
    monkeypatch.syspath_prepend(str(ASV_ROOT))
    yield
    for name in [name for name in sys.modules if name.split(".")[0] == "benchmarks"]:
        del sys.modules[name]


def test_the_covering_set_has_every_value():
    cases = _covering([["a", "b", "c"], [1, 2]])
    assert cases == [("a", 1), ("b", 2), ("c", 2)]
    assert _covering(["x", "y"]) == [("x",), ("y",)] and _covering([]) == [()]


@pytest.mark.parametrize("module_name", MODULES)
def test_asv_benchmarks_run(module_name, asv_suite):
    module = importlib.import_module(f"benchmarks.{module_name}")
    classes = _benchmark_classes(module)
    assert classes, f"{module_name} defines no benchmark"
    ran = skipped = 0
    for cls in classes:
        for case in _covering(getattr(cls, "params", [])):
            benchmark = cls()
            try:
                if hasattr(benchmark, "setup"):
                    benchmark.setup(*case)
            except NotImplementedError:  # asv's way to skip a combination (data absent)
                skipped += 1
                continue
            try:
                for name in sorted(dir(cls)):
                    if name.startswith(BENCHMARK_PREFIXES):
                        getattr(benchmark, name)(*case)
                        ran += 1
            finally:
                if hasattr(benchmark, "teardown"):
                    benchmark.teardown(*case)
    if not ran:
        pytest.skip(f"every benchmark of {module_name} skipped itself ({skipped} cases): "
                    "shared data or an optional dependency missing")


def test_asv_peers_get_the_index_dtype_scipy_picks(asv_suite):
    # The shared files store int64 indices; scipy.sparse.load_npz gives int32 where they fit,
    # and that is what scipy's and torch's users run on: ours and the peers alike get it.
    import numpy as np

    from benchmarks import bench_convert, bench_kernels
    try:
        matrix = bench_convert.load_matrix("pubmed")
    except NotImplementedError:
        pytest.skip("shared PubMed not present")
    assert matrix.index_dtype == np.int32 and matrix.has_canonical_format
    convert = bench_convert.Convert()
    convert.setup("pubmed", "mebcrs8")
    assert convert.scipy_csr.indices.dtype == np.int32
    pytest.importorskip("torch")
    spmm = bench_kernels.SpMM()
    spmm.setup("pubmed", 32, "csr")
    assert spmm.scipy_csr.indices.dtype == np.int32 and spmm.ours.index_dtype == np.int32
    assert str(spmm.tensor.crow_indices().dtype) == "torch.int32"
    assert str(spmm.tensor.col_indices().dtype) == "torch.int32"


def test_asv_setups_refuse_to_time_a_wrong_result(asv_suite, monkeypatch):
    # Each setup checks ours against the peer once: a product that went wrong fails the
    # benchmark instead of being timed.
    import numpy as np

    import pysparse_hpc as sph
    from benchmarks import _checks, bench_convert, bench_kernels
    with pytest.raises(AssertionError, match="x: differs from the reference by 0.5"):
        _checks.check_close("x", np.array([1.0, 1.0]), np.array([1.0, 2.0]))
    with pytest.raises(AssertionError, match="x: differs"):
        _checks.check_close("x", np.array([np.nan]), np.array([1.0]))
    try:
        bench_convert.load_matrix("bcsstk13")
    except NotImplementedError:
        pytest.skip("shared bcsstk13 not present")
    pytest.importorskip("torch")
    bench_kernels.SpMM().setup("bcsstk13", 32, "csr")
    bench_kernels.SDDMM().setup("bcsstk13", 32, "mebcrs")
    bench_convert.Convert().setup("bcsstk13", "mebcrs8")
    matmul = sph.csr_array.__matmul__
    monkeypatch.setattr(sph.csr_array, "__matmul__", lambda A, B: 2 * matmul(A, B))
    with pytest.raises(AssertionError, match=r"SpMM on bcsstk13 \(csr\): differs"):
        bench_kernels.SpMM().setup("bcsstk13", 32, "csr")
    tocsr = sph.blocked_array.tocsr

    def doubled(M):
        csr = tocsr(M)
        return sph.csr_array((2 * csr.data, csr.indices, csr.indptr), shape=csr.shape)
    monkeypatch.setattr(sph.blocked_array, "tocsr", doubled)
    with pytest.raises(AssertionError, match="mebcrs8 -> CSR on bcsstk13: not the same"):
        bench_convert.Convert().setup("bcsstk13", "mebcrs8")
