"""The result pool under finalizers, shutdown, threads and the many ways to share an array."""
import ctypes
import gc
import pickle
import sys
import threading

import numpy as np
import pytest

import pysparse_hpc as sph
from pysparse_hpc import _buffers

from .conftest import run_child  # noqa: E402
from .test_buffers import SHAPE  # noqa: E402

pytestmark = pytest.mark.usefixtures("empty_pool")

SENTINEL = 7.0


# A collection can run inside the pool's locked code (any allocation there may start one); the
# finalizers it runs are user code, and may call the pool again on the same thread.
_CALL_BACK_IN = """
    import gc
    import numpy as np
    import pysparse_hpc as sph
    from pysparse_hpc import _buffers

    N = (33 << 20) // 4       # float32: just above the pooled threshold
    inner = []

    class InACycle:
        def __init__(self):
            self.me = self    # only a collection frees it

        def __del__(self):
            inner.append({call})

    keep_returned = _buffers._keep_returned
    armed = []

    def collecting_first():  # where an allocation in the locked code starts a collection
        if armed:
            armed.clear()
            gc.collect()
        keep_returned()

    _buffers._keep_returned = collecting_first
    gc.disable()
    idle = _buffers.empty({idle_shape}, np.float32)
    del idle                  # an idle buffer for the locked code to look through
    InACycle()
    armed.append(True)
    result = _buffers.empty((N,), np.float32)
    _buffers._keep_returned = keep_returned
    assert len(inner) == 1
    {check}
    print("done")
"""


@pytest.mark.parametrize("call, idle_shape, check", [
    ("sph.cached_bytes()", "(N,)", "assert inner[0] >= 0"),
    # a release asked for inside the change is done when the change ends: the idle buffer of
    # another size is dropped
    ("sph.empty_cache()", "(N + (4 << 20),)", "assert sph.cached_bytes() == 0"),
    # the inner result gets memory of its own, not the idle buffer the outer one is taking
    ("_buffers.empty((N,), np.float32)", "(N,)",
     "assert not np.shares_memory(inner[0], result)"),
], ids=["cached_bytes", "empty_cache", "allocate"])
def test_a_finalizer_that_calls_back_in_does_not_deadlock(call, idle_shape, check):
    code = _CALL_BACK_IN.format(call=call, idle_shape=idle_shape, check=check)
    assert "done" in run_child(code, timeout=30).stdout


def test_a_large_result_in_a_finalizer_at_shutdown():
    """numpy.empty works in a ``__del__`` late in interpreter shutdown; so must a pooled result."""
    run = run_child("""
        import numpy as np
        from pysparse_hpc import _buffers

        class AtExit:
            def __del__(self):
                result = _buffers.empty(((33 << 20) // 4,), np.float32)
                result[-1] = 1.0
                print("allocated", result.base is not None)

        keeper = AtExit()   # a module global: freed during the final teardown
    """, timeout=30)
    assert "Exception ignored" not in run.stderr, run.stderr
    assert "allocated True" in run.stdout


def _as_array(thing):
    return np.asarray(thing)


def _torch_module():
    return pytest.importorskip("torch")


def _pickled_out_of_band(array):
    buffers = []
    data = pickle.dumps(array, protocol=5, buffer_callback=buffers.append)
    return pickle.loads(data, buffers=buffers)


DERIVED = {
    "slice": (lambda a: a[::2], _as_array),
    "reshape": (lambda a: a.reshape(-1), _as_array),
    "transpose": (lambda a: a.T, _as_array),
    "dtype view": (lambda a: a.view(np.int32), lambda d: d.view(np.float32)),
    "record view": (lambda a: a.view(np.dtype([("x", np.float32)])).view(np.recarray),
                    lambda d: d.x),
    "as_strided": (lambda a: np.lib.stride_tricks.as_strided(a, (a.size // 2,), (8,)),
                   _as_array),
    "memoryview": (memoryview, lambda m: np.frombuffer(m, np.float32)),
    "data": (lambda a: a.data, lambda m: np.frombuffer(m, np.float32)),
    "frombuffer": (lambda a: np.frombuffer(memoryview(a), np.float32), _as_array),
    "ndarray(buffer=)": (lambda a: np.ndarray(a.shape, a.dtype, buffer=a), _as_array),
    "ctypes from_buffer": (lambda a: (ctypes.c_float * a.size).from_buffer(a),
                           np.ctypeslib.as_array),
    "numpy dlpack": (np.from_dlpack, _as_array),
    "pickle out of band": (_pickled_out_of_band, _as_array),
    "base": (lambda a: a.base, _as_array),
    "torch.from_numpy": (lambda a: _torch_module().from_numpy(a), lambda t: t.numpy()),
    "torch dlpack": (lambda a: _torch_module().from_dlpack(a), lambda t: t.numpy()),
    "numpy from torch": (lambda a: np.from_dlpack(_torch_module().as_tensor(a)), _as_array),
}


@pytest.mark.parametrize("name", DERIVED)
def test_what_shares_a_result_keeps_its_buffer(pooled, name):
    derive, read = DERIVED[name]
    result = _buffers.empty(SHAPE, np.float32)
    result.fill(SENTINEL)
    derived = derive(result)
    del result
    gc.collect()
    assert sph.cached_bytes() == 0           # still in use
    others = [_buffers.empty(SHAPE, np.float32) for _ in range(2)]
    for other in others:
        other.fill(-1.0)
    assert np.all(read(derived) == SENTINEL)
    del derived
    gc.collect()
    assert sph.cached_bytes() > 0            # back once the last sharer is gone


def test_a_tensor_saved_for_backward_keeps_its_buffer(pooled):
    torch = _torch_module()
    result = _buffers.empty(SHAPE, np.float32)
    result.fill(SENTINEL)
    weight = torch.ones(1, requires_grad=True)
    loss = (torch.from_numpy(result) * weight).sum()   # saves the tensor for the gradient
    del result
    gc.collect()
    others = [_buffers.empty(SHAPE, np.float32) for _ in range(2)]
    for other in others:
        other.fill(-1.0)
    loss.backward()
    assert weight.grad.item() == SENTINEL * SHAPE[0] * SHAPE[1]


def test_threads_never_share_live_results(pooled):
    failures = []

    def work(seed):
        live = []
        for step in range(300):
            if len(live) < 3 and (step * seed) % 5 < 3:
                array = _buffers.empty(SHAPE, np.float32)
                array.fill(seed * 1000 + step)
                live.append((array, seed * 1000 + step))
            elif live:
                array, value = live.pop(0)
                if not np.all(array == value):
                    failures.append((seed, step))
            if step == 150:
                gc.collect()

    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    try:
        threads = [threading.Thread(target=work, args=(seed,)) for seed in range(1, 5)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(switch)
    assert failures == []
    gc.collect()
    idle = list(_buffers._idle.values())
    assert sph.cached_bytes() == sum(raw.nbytes for raw in idle)
    assert len({id(raw) for raw in idle}) == len(idle)
