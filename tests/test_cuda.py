"""CUDA kernels without a GPU: the simulator tests (in a subprocess, since the simulator must be
chosen before numba is imported) and PTX compile checks for real targets."""
import importlib.util
import os
import shutil
import subprocess
import sys

import pytest

from .conftest import REPO_ROOT

pytestmark = pytest.mark.cuda


def test_kernels_under_the_simulator():
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    # The simulator runs every CUDA thread in Python: two workers halve the wait.
    workers = ["-n", "2"] if importlib.util.find_spec("xdist") else []
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *workers,
         "tests/cuda_sim"],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-2000:]
    assert " passed" in result.stdout and "skipped" not in result.stdout.splitlines()[-1]


def _ptx(cc, source, signature):
    """PTX of a kernel source for compute capability ``cc``, or a skip saying what is missing."""
    from numba import cuda
    if cuda.compile_ptx is None:
        pytest.skip("numba.cuda.compile_ptx is unavailable (simulator enabled)")
    try:
        ptx, _ = cuda.compile_ptx(source, signature, cc=cc)
    except Exception as exc:  # NVRTC/NVVM wheels missing: say which
        if "NVVM" in str(exc) or "nvrtc" in str(exc).lower() or "libNVVM" in str(exc):
            pytest.skip(f"CUDA compiler libraries not installed: {exc}")
        raise
    return ptx


def _assert_no_spills(ptx, cc, tmp_path):
    """``ptxas -v`` assembles the PTX without spilling registers (where ptxas is present)."""
    ptxas = shutil.which("ptxas")
    if ptxas is None:
        return
    (tmp_path / "k.ptx").write_text(ptx)
    result = subprocess.run([ptxas, f"-arch=sm_{cc[0]}{cc[1]}", "-v", str(tmp_path / "k.ptx"),
                             "-o", str(tmp_path / "k.cubin")], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    report = result.stdout + result.stderr
    assert "0 bytes spill stores" in report and "0 bytes spill loads" in report, report


def _types():
    from numba import types
    return types.float32, types.float16, types.int32, types.int64, types.uint8


def _spmm_ptx(cc, kernel, paired=False, dense="f32"):
    from pysparse_hpc.kernels.cuda import spmm
    f32, f16, i32, i64, _ = _types()
    B = {"f32": f32, "f16": f16}[dense][:, ::1]
    signature = (i32[::1], i32[::1], B.dtype[::1], i64, B, f32[:, ::1], i64[::1], i64[::1],
                 i64[::1], i32[::1])
    source = (spmm._blocked16_spmm_tf32 if kernel == "tf32-16x1"
              else spmm.MEBCRS_SPMM_SOURCES[kernel, paired])
    return _ptx(cc, source, signature)


@pytest.mark.parametrize("cc", [(8, 0), (9, 0)])
@pytest.mark.parametrize("kernel,paired,dense,mma_types,conversion", [
    ("tf32", True, "f32", ".f32.tf32.tf32.f32", "cvt.rna.tf32.f32"),
    ("tf32", False, "f32", ".f32.tf32.tf32.f32", "cvt.rna.tf32.f32"),
    ("fp16", True, "f32", ".f32.f16.f16.f32", "cvt.rn.f16x2.f32"),  # fp32 accumulators
    ("fp16", True, "f16", ".f32.f16.f16.f32", "cvt.rn.f16x2.f32"),  # half B and values
    ("fp16", False, "f16", ".f32.f16.f16.f32", "cvt.rn.f16x2.f32"),
    ("tf32-16x1", False, "f32", ".f32.tf32.tf32.f32", "cvt.rna.tf32.f32"),  # the ablation
])
def test_tensor_core_kernel_compiles_to_mma(cc, kernel, paired, dense, mma_types, conversion,
                                            tmp_path):
    ptx = _spmm_ptx(cc, kernel, paired, dense)
    mma_lines = [line for line in ptx.splitlines() if "mma.sync.aligned.m16n8k8" in line]
    assert mma_lines and all(mma_types in line for line in mma_lines)
    assert conversion in ptx
    # FlashSparse's mapping: a lane's two columns of B in one load, of C in one store.
    pair_load = {"f32": "ld.global.v2.f32", "f16": "ld.global.v2.u16"}[dense]
    assert (pair_load in ptx) == paired and ("st.global.v2.f32" in ptx) == paired
    _assert_no_spills(ptx, cc, tmp_path)


@pytest.mark.parametrize("cc", [(8, 0), (9, 0)])
@pytest.mark.parametrize("precision,mma,dense", [
    ("tf32", "m16n8k8.row.col.f32.tf32.tf32.f32", "f32"),
    ("fp16", "m16n8k16.row.col.f32.f16.f16.f32", "f32"),
    ("fp16", "m16n8k16.row.col.f32.f16.f16.f32", "f16"),  # half operands read as they are
])
@pytest.mark.parametrize("strided", [False, True])  # True: one head of (n, heads, F)
def test_sddmm_tensor_core_kernels_compile(cc, precision, mma, dense, strided, tmp_path):
    from pysparse_hpc.kernels.cuda import sddmm
    f32, f16, i32, i64, u8 = _types()
    value = {"f32": f32, "f16": f16}[dense]
    operand, out = (value[:, :], f32[:]) if strided else (value[:, ::1], f32[::1])
    ptx = _ptx(cc, sddmm.MEBCRS_SDDMM_SOURCES[precision],
               (i32[::1], i32[::1], u8[::1], i64[::1], i64[::1], i64, operand, operand, out))
    mma_lines = [line for line in ptx.splitlines() if "mma.sync.aligned" in line]
    assert mma_lines and all(mma in line for line in mma_lines)
    _assert_no_spills(ptx, cc, tmp_path)


@pytest.mark.parametrize("cc", [(8, 0), (9, 0)])
def test_csr_kernels_keep_float32_sums_in_float32(cc):
    """The CUDA-core kernels accumulate in the output's dtype (no float64 arithmetic)."""
    from pysparse_hpc.kernels.cuda import sddmm, spmm
    f32, _, i32, _, _ = _types()
    ptx = (_ptx(cc, spmm._csr_spmm, (i32[::1], i32[::1], f32[::1], f32[:, ::1], f32[:, ::1]))
           + _ptx(cc, sddmm._csr_sddmm, (i32[::1], i32[::1], f32[:, ::1], f32[:, ::1],
                                         f32[::1])))
    assert "fma.rn.f32" in ptx and ".f64" not in ptx


@pytest.mark.parametrize("cc", [(8, 0), (9, 0)])
def test_zero_fill_compiles_to_float32_stores(cc):
    """The fill that zeroes SDDMM outputs stores float32 zeros element by element."""
    from pysparse_hpc.kernels.cuda import spmm
    f32, _, _, _, _ = _types()
    ptx = _ptx(cc, spmm._zero_flat.py_func, (f32[::1],))
    assert "st.global.u32" in ptx or "st.global.f32" in ptx
    assert ".f64" not in ptx


@pytest.mark.parametrize("shape,h", [((5, 3, 4), 2), ((7, 2), 1), ((4, 3, 2, 5), 0)])
def test_head_views_address_the_right_elements(shape, h):
    """The per-head views of multi-head SDDMM operands are built from the CUDA array interface;
    the same arithmetic on NumPy's array interface must give ``array[:, h]``."""
    import numpy as np

    from pysparse_hpc.kernels.cuda.sddmm import c_strides, head_interface
    array = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
    assert c_strides(shape, 4) == array.strides
    wider_shape = (shape[0], 2 * shape[1]) + shape[2:]
    wider = np.arange(2 * array.size, dtype=np.float32).reshape(wider_shape)
    for source in (array, wider[:, ::2]):  # contiguous, and strided along the heads
        interface = dict(source.__array_interface__, strides=source.strides)

        class View:
            __array_interface__ = head_interface(interface, h)
        np.testing.assert_array_equal(np.asarray(View()), source[:, h])


def test_column_views_address_the_right_elements():
    """A 1-D device B is read as an (n, 1) view built from the CUDA array interface; the same
    arithmetic on NumPy's array interface must give ``vector[:, None]``."""
    import numpy as np

    from pysparse_hpc._cuda_backend import column_interface
    matrix = np.arange(15, dtype=np.float32).reshape(5, 3)
    for vector in (matrix[:, 0].copy(), matrix[:, 2]):  # contiguous (no strides), strided
        interface = dict(vector.__array_interface__)
        if vector.flags.c_contiguous:
            interface["strides"] = None

        class View:
            __array_interface__ = column_interface(interface, 4)
        np.testing.assert_array_equal(np.asarray(View()), vector[:, None])


class _CompilingLaunch:
    """Stands in for ``scale_add``: each launch compiles the kernel for a real target with the
    argument types it was given (what the driver path does, and the simulator skips), and
    refuses an empty grid as the driver does."""

    def __init__(self, cc):
        self.cc = cc
        self.launches = 0

    def __getitem__(self, config):
        grid, _ = config
        assert grid >= 1, f"a launch with grid {grid}: the driver refuses it"

        def launch(*args):
            import numba

            from pysparse_hpc.kernels.cuda import sddmm
            _ptx(self.cc, sddmm._scale_add, tuple(numba.typeof(a) for a in args))
            self.launches += 1
        return launch


@pytest.mark.parametrize("heads", [None, 3, 0])
def test_scale_add_compiles_for_multi_head_results(heads, monkeypatch):
    """`sddmm_cuda` scales a multi-head result (slots, heads) with ``beta == 0`` and no stored
    values to add; the kernel, typed for a 1-D addend, must still compile (passing the 2-D
    result as the unread addend failed to type on a real GPU), and (slots, 0 heads) launches
    nothing."""
    import numpy as np

    from pysparse_hpc.kernels.cuda import sddmm
    launch = _CompilingLaunch((8, 0))
    monkeypatch.setattr(sddmm, "scale_add", launch)
    out = np.ones((5,) if heads is None else (5, heads), np.float32)
    # beta == 0 with the result itself as the unread addend (what `sddmm_cuda` passed), or none
    sddmm.launch_scale_add(out, out, np.float32(2.0), np.float32(0.0))
    sddmm.launch_scale_add(out, None, np.float32(2.0), np.float32(0.0))
    sddmm.launch_scale_add(out, np.ones(5, np.float32), np.float32(2.0), np.float32(0.5))
    assert launch.launches == (0 if heads == 0 else 3)


@pytest.mark.parametrize("launcher", ["spmm_launcher", "sddmm_launcher"])
@pytest.mark.parametrize("precision, dtype, message", [
    ("fp32", "float16", "precision='fp32' computes in float32 or float64, got dtype float16"),
    ("fp32", "int32", "computes in float32 or float64, got dtype int32"),
    ("tf32", "float64", "precision='tf32' computes in float32, got dtype float64"),
])
def test_benchmark_launchers_check_their_dtype(launcher, precision, dtype, message):
    """A launcher built a kernel typed for any dtype (or ignored it for the tensor-core
    precisions): refused before any kernel or GPU is needed."""
    import numpy as np

    import pysparse_hpc as sph
    from pysparse_hpc import _cuda_backend
    A = sph.csr_array(np.eye(8, dtype=np.float32))
    with pytest.raises(TypeError, match=message):
        getattr(_cuda_backend, launcher)(A, precision, dtype=np.dtype(dtype))
    with pytest.raises(ValueError, match="precision must be one of"):
        getattr(_cuda_backend, launcher)(A, "fp64")
