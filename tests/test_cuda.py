"""CUDA kernels without a GPU: the simulator tests (in a subprocess, since the simulator must be
chosen before numba is imported) and PTX compile checks for real targets."""
import os
import shutil
import subprocess
import sys

import pytest

from .conftest import REPO_ROOT

pytestmark = pytest.mark.cuda


def test_kernels_under_the_simulator():
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/cuda_sim"],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-2000:]
    assert " passed" in result.stdout and "skipped" not in result.stdout.splitlines()[-1]


def _compile_ptx(cc, kernel):
    from numba import cuda, types
    from pysparse_hpc.kernels.cuda import spmm
    if cuda.compile_ptx is None:
        pytest.skip("numba.cuda.compile_ptx is unavailable (simulator enabled)")
    f32, i32 = types.float32, types.int32
    i64 = types.int64
    signature = (i32[::1], i32[::1], f32[::1], i64, f32[:, ::1], f32[:, ::1], i64[::1], i64[::1],
                 i64[::1], types.int32[::1])
    try:
        source = (spmm._blocked16_spmm_tf32 if kernel == "tf32-16x1"
                  else spmm.MEBCRS_SPMM_SOURCES[kernel])
        ptx, _ = cuda.compile_ptx(source, signature, cc=cc)
    except Exception as exc:  # NVRTC/NVVM wheels missing: say which
        if "NVVM" in str(exc) or "nvrtc" in str(exc).lower() or "libNVVM" in str(exc):
            pytest.skip(f"CUDA compiler libraries not installed: {exc}")
        raise
    return ptx


@pytest.mark.parametrize("cc", [(8, 0), (9, 0)])
@pytest.mark.parametrize("kernel,mma_types,conversion", [
    ("tf32", ".f32.tf32.tf32.f32", "cvt.rna.tf32.f32"),
    ("fp16", ".f32.f16.f16.f32", "cvt.rn.f16x2.f32"),  # fp32 accumulators
    ("tf32-16x1", ".f32.tf32.tf32.f32", "cvt.rna.tf32.f32"),  # the 16x1 ablation
])
def test_tensor_core_kernel_compiles_to_mma(cc, kernel, mma_types, conversion, tmp_path):
    ptx = _compile_ptx(cc, kernel)
    mma_lines = [line for line in ptx.splitlines() if "mma.sync.aligned.m16n8k8" in line]
    assert mma_lines and all(mma_types in line for line in mma_lines)
    assert conversion in ptx
    ptxas = shutil.which("ptxas")
    if ptxas is None:
        return
    (tmp_path / "k.ptx").write_text(ptx)
    result = subprocess.run([ptxas, f"-arch=sm_{cc[0]}{cc[1]}", "-v", str(tmp_path / "k.ptx"),
                             "-o", str(tmp_path / "k.cubin")], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    report = result.stdout + result.stderr
    assert "0 bytes spill stores" in report and "0 bytes spill loads" in report, report


@pytest.mark.parametrize("cc", [(8, 0), (9, 0)])
def test_sddmm_kernels_compile(cc):
    from numba import cuda, types
    from pysparse_hpc.kernels.cuda import sddmm
    if cuda.compile_ptx is None:
        pytest.skip("numba.cuda.compile_ptx is unavailable (simulator enabled)")
    f32, i32, i64, u8 = types.float32, types.int32, types.int64, types.uint8
    try:
        ptx, _ = cuda.compile_ptx(sddmm._mebcrs_sddmm_tf32,
                                  (i32[::1], i32[::1], u8[::1], i64, f32[:, ::1], f32[:, ::1],
                                   f32[::1]), cc=cc)
        cuda.compile_ptx(sddmm._csr_sddmm, (i32[::1], i32[::1], f32[:, ::1], f32[:, ::1],
                                            f32[::1]), cc=cc)
    except Exception as exc:
        if "NVVM" in str(exc) or "nvrtc" in str(exc).lower():
            pytest.skip(f"CUDA compiler libraries not installed: {exc}")
        raise
    assert "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32" in ptx
