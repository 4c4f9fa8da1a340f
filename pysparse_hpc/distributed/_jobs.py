"""Jobs started from Python (an ``mpiexec`` run and its ranks) that never outlive their caller.

A job runs in a process group of its own, so that stopping it reaches the launcher and every
process under it. Killing the launcher alone, as ``subprocess.run``'s timeout does, can leave
its ranks running: MPICH's ranks are children of its process manager, not of ``mpiexec``.
"""
import contextlib
import os
import signal
import subprocess
import time

__all__ = ["run_job", "stop_job"]


def _group_alive(pgid):
    """Whether a process of group ``pgid`` is left (signal 0 tests without sending)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # a member that changed its user: still there
        return True
    return True


def stop_job(process, grace=5.0):
    """End ``process`` and its process group: SIGTERM, then SIGKILL after ``grace`` seconds
    unless every process of the group has ended.

    ``process`` must have been started with ``start_new_session=True``. The whole group is
    waited for, not the launcher alone: a launcher that ends on SIGTERM may leave a rank that
    ignores or handles it (blocked in MPI, its Python handler never runs) running for ever.
    """
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + grace
        while True:
            # Reaped first: the launcher, once ended, is a member of the group until then.
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=max(0.0, min(0.05, deadline - time.monotonic())))
            if not _group_alive(process.pid):
                return
            if time.monotonic() >= deadline:
                break
            time.sleep(0.05)


def run_job(command, timeout, env=None):
    """Run ``command`` in a process group of its own, its output captured as text.

    Parameters
    ----------
    command : list of str
    timeout : float
        Seconds; past it the whole group is stopped (`stop_job`).
    env : dict, optional

    Returns
    -------
    subprocess.CompletedProcess

    Raises
    ------
    subprocess.TimeoutExpired
        After the job was stopped. An interrupt of the caller stops it too.
    """
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, env=env, start_new_session=True)
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except BaseException:  # timed out, interrupted or terminated: nothing may outlive us
        stop_job(process)
        # A process that left the group could hold the pipes open: do not wait on it for ever.
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.communicate(timeout=5)
        raise
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)
