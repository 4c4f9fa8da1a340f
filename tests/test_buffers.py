"""Large results reuse the memory of freed ones; live results never share it."""
import copy
import multiprocessing
import os
import pickle
import subprocess
import sys
import threading

import numpy as np
import pytest
import scipy.sparse

import pysparse_hpc as sph
from pysparse_hpc import _buffers, _config
from pysparse_hpc.ops import pattern_spmm

from .conftest import random_scipy, run_child

SHAPE = (300, 70)


# Each test starts and ends with an empty pool (`empty_pool` in conftest.py).
pytestmark = pytest.mark.usefixtures("empty_pool")


def test_small_results_own_their_memory():
    array = _buffers.empty(SHAPE, np.float32)
    assert array.flags.owndata and array.shape == SHAPE and array.dtype == np.float32
    del array
    assert sph.cached_bytes() == 0


def test_freed_buffer_is_reused(pooled):
    first = _buffers.empty(SHAPE, np.float64)
    assert first.flags.c_contiguous and first.flags.writeable
    assert first.shape == SHAPE and first.dtype == np.float64
    assert first.ctypes.data % 64 == 0
    address = first.ctypes.data
    del first
    assert sph.cached_bytes() > 0
    second = _buffers.empty((SHAPE[1], SHAPE[0]), np.float64)   # same size, another shape
    assert second.ctypes.data == address
    assert sph.cached_bytes() == 0


def test_live_results_never_share(pooled):
    arrays = [_buffers.empty(SHAPE, np.float32) for _ in range(3)]
    for i, a in enumerate(arrays):
        for b in arrays[i + 1:]:
            assert not np.shares_memory(a, b)


def test_a_view_keeps_the_buffer(pooled):
    first = _buffers.empty(SHAPE, np.float32)
    first.fill(1.0)
    view = first[10:20]
    del first
    assert sph.cached_bytes() == 0      # still referred to by the view
    second = _buffers.empty(SHAPE, np.float32)
    assert not np.shares_memory(view, second)
    second.fill(2.0)
    assert np.all(view == 1.0)
    del view
    assert sph.cached_bytes() > 0


def test_a_torch_tensor_keeps_the_buffer(pooled):
    torch = pytest.importorskip("torch")
    first = _buffers.empty(SHAPE, np.float32)
    first.fill(1.0)
    tensor = torch.from_numpy(first)
    del first
    second = _buffers.empty(SHAPE, np.float32)
    second.fill(2.0)
    assert torch.all(tensor == 1.0)
    del tensor
    assert sph.cached_bytes() > 0


def test_a_buffer_freed_under_the_lock_is_kept(pooled):
    array = _buffers.empty(SHAPE, np.float32)
    with _buffers._lock:    # as when a collection runs inside the pool's own locked code
        del array           # the finalizer must not wait for the lock
    assert sph.cached_bytes() > 0


def test_idle_bytes_are_capped(pooled, monkeypatch):
    one = _buffers.empty(SHAPE, np.float32)
    capacity = one.base._raw.nbytes
    monkeypatch.setattr(_config, "_BUFFER_CACHE_BYTES", 2 * capacity)
    arrays = [one] + [_buffers.empty(SHAPE, np.float32) for _ in range(2)]
    oldest_kept = arrays[1].base._raw
    del one
    arrays.clear()   # the first freed is dropped once a third arrives
    assert sph.cached_bytes() == 2 * capacity
    assert any(raw is oldest_kept for raw in _buffers._idle.values())


def test_zero_limit_turns_reuse_off(pooled, monkeypatch):
    monkeypatch.setattr(_config, "_BUFFER_CACHE_BYTES", 0)
    array = _buffers.empty(SHAPE, np.float32)
    assert array.flags.owndata
    del array
    assert sph.cached_bytes() == 0


def test_a_result_above_the_cap_owns_its_memory(pooled, monkeypatch):
    """A buffer the pool could never keep once freed is not handed out through it."""
    capacity = _buffers.empty(SHAPE, np.float32).base._raw.nbytes
    monkeypatch.setattr(_config, "_BUFFER_CACHE_BYTES", capacity - 1)
    array = _buffers.empty(SHAPE, np.float32)
    assert array.flags.owndata and array.shape == SHAPE
    monkeypatch.setattr(_config, "_BUFFER_CACHE_BYTES", capacity)
    assert not _buffers.empty(SHAPE, np.float32).flags.owndata


def test_empty_cache_releases_idle_buffers(pooled):
    array = _buffers.empty(SHAPE, np.float32)
    in_use = _buffers.empty(SHAPE, np.float32)
    del array
    assert sph.cached_bytes() > 0
    sph.empty_cache()
    assert sph.cached_bytes() == 0
    in_use.fill(3.0)          # a live result is untouched by the release
    del in_use
    assert sph.cached_bytes() > 0


def test_idle_buffers_are_released_when_memory_runs_out():
    """Freed results of other sizes stayed idle in the pool (up to its cap) while an
    allocation that needed their memory failed with a MemoryError: the pool now gives them
    back and the allocation is tried again. Address space capped above the current size."""
    code = """
        import resource
        import numpy as np
        import pysparse_hpc as sph
        from pysparse_hpc import _buffers
        size = next(int(line.split()[1]) * 1024 for line in open("/proc/self/status")
                    if line.startswith("VmSize:"))
        resource.setrlimit(resource.RLIMIT_AS, (size + (700 << 20),) * 2)
        for megabytes in (150, 160, 170):
            _buffers.empty((megabytes << 18,), np.float32)   # freed at once: kept idle
        assert sph.cached_bytes() > 450 << 20
        array = _buffers.empty((400 << 18,), np.float32)
        array.fill(1.0)
        print("allocated", sph.cached_bytes())
        try:
            np.empty(600 << 20, np.uint8)                    # still refused: none left
        except MemoryError:
            print("refused")
        """
    out = run_child(code, timeout=60).stdout.split()
    assert out == ["allocated", "0", "refused"], out


def test_object_dtype_is_never_pooled(pooled):
    stale = _buffers.empty((40,), np.float64)
    stale.fill(0.0)   # zeros, not junk: on failure the stale bytes would read as pointers
    del stale
    array = _buffers.empty((40,), object)
    owns = array.flags.owndata   # asserted alone: showing the array would read the pointers
    assert owns
    assert all(item is None for item in array)


@pytest.mark.parametrize("dtype, shape", [
    (np.dtype([("x", np.float64), ("k", np.int32)], align=True), (5,)),
    (np.dtype([("x", np.float32), ("y", np.float32, (2,))]), (4, 3)),
    (np.dtype((np.float64, (3,))), (5,)),
    (np.dtype(np.float64, metadata={"unit": "m"}), (6, 2)),
])
def test_dtypes_as_numpy_empty_gives_them(pooled, dtype, shape):
    expected = np.empty(shape, dtype)
    array = _buffers.empty(shape, dtype)
    assert array.shape == expected.shape and array.dtype == expected.dtype
    assert array.dtype.names == expected.dtype.names
    assert array.dtype.metadata == expected.dtype.metadata
    assert array.ctypes.data % 64 == 0 and array.flags.c_contiguous


def test_extents_are_checked_as_numpy_checks_them(pooled):
    with pytest.raises(TypeError):
        _buffers.empty((3.7, 40), np.float64)   # not truncated to 3 rows
    with pytest.raises(ValueError, match="negative"):
        _buffers.empty((-40, -40), np.float64)  # a positive size, from two negative extents


@pytest.mark.parametrize("duplicate", [copy.copy, copy.deepcopy,
                                       lambda owner: pickle.loads(pickle.dumps(owner))])
def test_the_buffer_owner_is_not_copied(pooled, duplicate):
    """A copy of a result's base would refer to its buffer without the finalizer that knows
    when the buffer is free: the pool would hand the memory out again under the copy."""
    array = _buffers.empty(SHAPE, np.float32)
    with pytest.raises(TypeError, match="copy or pickle the array"):
        duplicate(array.base)
    assert np.array_equal(pickle.loads(pickle.dumps(array)).shape, SHAPE)  # the array pickles


def _allocate_and_exit():
    assert sph.cached_bytes() == 0   # the parent's idle pages are not the child's to reuse
    result = _buffers.empty(SHAPE, np.float32)
    del result
    assert sph.cached_bytes() > 0


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs the fork start method")
def test_a_forked_child_does_not_wait_for_a_parent_thread(pooled):
    """A thread of the parent holds the pool's lock when another forks; no thread of the child
    would ever release that copy of it."""
    held, release = threading.Event(), threading.Event()

    def hold_the_lock():
        with _buffers._lock:
            held.set()
            release.wait()

    idle = _buffers.empty(SHAPE, np.float32)
    del idle   # an idle buffer in the parent at the fork
    holder = threading.Thread(target=hold_the_lock)
    holder.start()
    held.wait()
    child = multiprocessing.get_context("fork").Process(target=_allocate_and_exit)
    try:
        child.start()
    finally:
        release.set()
        holder.join()
    child.join(20)
    if child.is_alive():
        child.kill()
        child.join()
        pytest.fail("the forked child deadlocked on the pool's lock")
    assert child.exitcode == 0
    assert sph.cached_bytes() > 0    # the parent keeps its own


def _poison_pool(shape, dtype):
    """Leave an idle buffer full of NaN where the next result of ``shape`` will be placed."""
    stale = _buffers.empty(shape, dtype)
    stale.fill(np.nan)
    del stale


FORMATS = {"csr": lambda A: A, "mebcrs": lambda A: A.to_mebcrs(),
           "blocked16": lambda A: A.to_blocked(16)}


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("layout", ["C", "F"])
def test_spmm_overwrites_reused_memory(pooled, kernel_mode, rng, fmt, layout):
    S = random_scipy(rng, (90, 40), 0.1).tolil()
    S[20:45] = 0        # empty rows and whole empty windows
    S = scipy.sparse.csr_array(S)
    A = FORMATS[fmt](sph.csr_array(S))
    B = np.asarray(rng.standard_normal((40, 33)), order=layout)
    _poison_pool((90, 33), np.float64)
    np.testing.assert_allclose(A @ B, S @ B, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("fmt", FORMATS)
def test_sddmm_overwrites_reused_memory(pooled, kernel_mode, rng, fmt):
    S = random_scipy(rng, (60, 50), 0.1)
    A = FORMATS[fmt](sph.csr_array(S))
    X, Y = rng.standard_normal((60, 9)), rng.standard_normal((50, 9))
    _poison_pool((A.nnz,), np.float64)
    result = sph.sddmm(A, X, Y)
    np.testing.assert_allclose(result.toarray(), (S.toarray() != 0) * (X @ Y.T), atol=1e-12)


def test_multi_head_spmm_overwrites_reused_memory(pooled, kernel_mode, rng):
    S = random_scipy(rng, (50, 40), 0.1)
    A = sph.csr_array(S)
    values = rng.standard_normal((A.nnz, 3))
    B = rng.standard_normal((40, 3, 5))
    _poison_pool((50, 3, 5), np.float64)
    result = pattern_spmm(A, values, B)
    for h in range(3):
        head = scipy.sparse.csr_array((values[:, h], A.indices, A.indptr), shape=A.shape)
        np.testing.assert_allclose(result[:, h], head @ B[:, h], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("setting, expected", [
    ("0", "0"),
    ("-1", "0"),                       # negative: off, as 0
    ("37", "0"),                       # the 38 MiB buffer is over the cap: not kept
    ("64", str(38 << 20)),             # 36 MiB and the alignment, in 2 MiB steps
    ("ten", "must be an integer, got 'ten'"),
])
def test_cache_limit_from_the_environment(setting, expected):
    """PYSPARSE_HPC_BUFFER_CACHE_MB: 0 keeps nothing, a number caps the idle MiB, anything
    else stops the import with the variable's name (checked in a fresh interpreter)."""
    code = ("import numpy as np, pysparse_hpc as sph\n"
            "from pysparse_hpc import _buffers\n"
            "result = _buffers.empty((9, 1 << 20), np.float32)  # 36 MiB: pooled\n"
            "del result\n"
            "print(sph.cached_bytes())\n")
    env = dict(os.environ, PYSPARSE_HPC_BUFFER_CACHE_MB=setting)
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    if expected.isdigit():
        assert run.returncode == 0, run.stderr
        assert run.stdout.strip() == expected
    else:
        assert run.returncode != 0
        assert f"PYSPARSE_HPC_BUFFER_CACHE_MB {expected}" in run.stderr
