"""Jobs started from Python (an ``mpiexec`` run and its ranks) that never outlive their caller.

A job runs in a process group of its own, so that stopping it reaches the launcher and every
process under it. Killing the launcher alone, as ``subprocess.run``'s timeout does, can leave
its ranks running: MPICH's ranks are children of its process manager, not of ``mpiexec``.
"""
import contextlib
import os
import signal
import subprocess

__all__ = ["run_job", "stop_job"]


def stop_job(process, grace=5.0):
    """End ``process`` and its process group: SIGTERM, then SIGKILL after ``grace`` seconds.

    ``process`` must have been started with ``start_new_session=True``.
    """
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=grace)
            return
        except subprocess.TimeoutExpired:
            continue


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
