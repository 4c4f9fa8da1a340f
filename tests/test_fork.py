"""A child forked from a process that has run the kernels (multiprocessing's default start
method on Linux, torch's data-loader workers) computes what the parent computes, on one
thread: Numba ended such a child under GNU OpenMP, and a parallel conversion waited for ever
on threads that were not forked."""
import multiprocessing
import os
import threading

import numpy as np
import pytest

import pysparse_hpc as sph
from pysparse_hpc import _config

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs the fork start method")


def _operands():
    A = sph.datasets.load("cora").adj
    B = np.random.default_rng(0).standard_normal((A.shape[1], 64)).astype(np.float32)
    return A, B


def _compute(A, B):
    M = A.to_mebcrs()
    return A @ B, M @ B, M.tocsr().data, sph.reorder(A, "rcm"), sph.sddmm(A, B, B).data


def _child(expected, lock_was_held, queue):
    try:
        A, B = _operands()
        got = _compute(A, B)
        same = all(np.array_equal(g, e) for g, e in zip(got, expected))
        try:
            sph.set_num_threads(2)
            refused = False
        except RuntimeError as exc:
            refused = "'spawn' or 'forkserver'" in str(exc)
        queue.put((same, sph.get_num_threads(), refused,
                   lock_was_held and not _config._WORKQUEUE_LOCK.locked()))
    except BaseException as exc:   # reported, not lost with the child
        queue.put(repr(exc))


def test_a_forked_child_computes_on_one_thread_what_the_parent_computes():
    A, B = _operands()
    expected = _compute(A, B)   # the parent's kernels and conversions ran on its threads
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    held, release = threading.Event(), threading.Event()

    def hold_the_launch_lock():   # a parent thread inside a kernel under workqueue
        with _config._WORKQUEUE_LOCK:
            held.set()
            release.wait()

    holder = threading.Thread(target=hold_the_launch_lock)
    holder.start()
    held.wait()
    child = context.Process(target=_child, args=(expected, True, queue))
    try:
        child.start()
    finally:
        release.set()
        holder.join()
    child.join(60)
    if child.is_alive():
        child.kill()
        child.join()
        pytest.fail("the forked child hung")
    assert child.exitcode == 0, f"the forked child ended with {child.exitcode}"
    report = queue.get(timeout=10)
    assert report == (True, 1, True, True), report
    # the parent keeps its own count, and may still change it
    assert sph.get_num_threads() == _config._num_threads
    sph.set_num_threads(sph.get_num_threads())
