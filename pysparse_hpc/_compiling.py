"""The first run: Numba compiles a kernel the first time it meets a new combination of argument
types, a second or more per kernel, and keeps the result in its on-disk cache (the kernels are
``cache=True``), so later runs load it in milliseconds.

Two helpers for that first run:

- `compile_messages`: while active, a kernel that takes longer than a moment to compile says so
  on one line, so that a progress bar that has stopped says why;
- `compile_ahead`: a job's kernels compiled by a helper process into the cache while this process
  does other work (compiling runs on one core; the helper takes the other), started only when
  the job would meet a kernel that is not cached yet.
"""
import contextlib
import os
import subprocess
import sys
import threading

from numba.core import event

__all__ = ["compile_messages", "runs_cached", "compile_ahead", "CompileAhead"]

_COMPILE = "numba:compile"


def _is_ours(dispatcher):
    function = getattr(dispatcher, "py_func", None)
    return function is not None and function.__module__.startswith(__package__ + ".")


def _is_cached(dispatcher):
    """Whether the dispatcher keeps what it compiles on disk (``cache=True``)."""
    cache = getattr(dispatcher, "_cache", None)
    return cache is not None and type(cache).__name__ != "NullCache"


def _write_stderr(line):
    print(line, file=sys.stderr, flush=True)


class _Announcer(event.Listener):
    """Writes a line when a compile of one of the library's kernels outlasts ``delay`` seconds.

    Numba compiles under one global lock, so starts and ends arrive one compile at a time
    (nested: a kernel compiles the functions it calls); only the outermost is announced.
    """

    def __init__(self):
        self.writers = []   # (write, delay); the innermost `compile_messages` speaks
        self.depth = 0
        self.timer = None

    def on_start(self, compile_event):
        self.depth += 1
        dispatcher = compile_event.data.get("dispatcher")
        if self.depth != 1 or not self.writers or not _is_ours(dispatcher):
            return
        write, delay = self.writers[-1]
        line = (f"pysparse_hpc: compiling {dispatcher.py_func.__name__} (first use with these "
                "argument types; Numba keeps it in its on-disk cache)")
        self.timer = threading.Timer(delay, write, [line])
        self.timer.daemon = True
        self.timer.start()

    def on_end(self, compile_event):
        self.depth = max(0, self.depth - 1)
        if self.depth == 0 and self.timer is not None:
            self.timer.cancel()
            self.timer = None


_announcer = _Announcer()
_announcer_lock = threading.Lock()


@contextlib.contextmanager
def compile_messages(write=None, delay=0.5):
    """Announce the library's kernels that take more than ``delay`` seconds to compile.

    Parameters
    ----------
    write : callable, optional
        Takes one line of text; default: print it to standard error. Pass ``tqdm.write`` while
        a tqdm bar is shown.
    delay : float
        Seconds a compile runs before it is announced (loads from the cache take milliseconds
        and are never announced).

    Nested uses speak through the innermost ``write``.
    """
    with _announcer_lock:
        if not _announcer.writers:
            event.register(_COMPILE, _announcer)
        _announcer.writers.append((write or _write_stderr, delay))
    try:
        yield
    finally:
        with _announcer_lock:
            _announcer.writers.pop()
            if not _announcer.writers:
                event.unregister(_COMPILE, _announcer)


class _WouldCompile(Exception):
    pass


class _RefuseCompiling(event.Listener):
    def on_start(self, compile_event):
        if _is_cached(compile_event.data.get("dispatcher")):
            raise _WouldCompile

    def on_end(self, compile_event):
        pass


def runs_cached(function, *args):
    """Run ``function(*args)`` on cached kernels only: True when it ran to the end, False when
    it stopped at the first kernel that Numba would have to compile (nothing compiled).

    Kernels without an on-disk cache compile as usual. ``function`` must not need its work
    finished when it stops early (a throw-away run, such as one training epoch).
    """
    refuse = _RefuseCompiling()
    event.register(_COMPILE, refuse)
    try:
        function(*args)
    except _WouldCompile:
        return False
    finally:
        event.unregister(_COMPILE, refuse)
    return True


class CompileAhead:
    """A helper process compiling a job's kernels into Numba's on-disk cache.

    Parameters
    ----------
    workload : str
        A name in `WORKLOADS`.
    args : sequence of str
        Its arguments.
    """

    def __init__(self, workload, args):
        command = [sys.executable, "-m", __name__, workload, *args]
        # The same environment: the same threads (serial or parallel kernels) and cache.
        self._process = subprocess.Popen(command, stdout=subprocess.DEVNULL,
                                         stderr=subprocess.PIPE, text=True, env=dict(os.environ))
        self.workload = workload

    def stop(self):
        """End the helper if it still runs (its kernels cache as far as they got)."""
        if self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        if self._process.stderr is not None:
            self._process.stderr.close()

    def wait(self, write=None):
        """Wait for the helper; say so when it is still running. A helper that failed is
        reported and otherwise harmless: this process compiles what is missing."""
        write = write or _write_stderr
        if self._process.poll() is None:
            write(f"pysparse_hpc: waiting for the {self.workload} kernels a helper process is "
                  "compiling (first run only: they are cached on disk)")
        _, errors = self._process.communicate()
        if self._process.returncode != 0:
            write(f"pysparse_hpc: compiling the {self.workload} kernels ahead failed (exit status "
                  f"{self._process.returncode}); they compile on first use instead:\n"
                  f"{errors[-1000:]}")
        return self._process.returncode


def _gnn_epochs(dataset, *model_names):
    """One training epoch (forward, backward, evaluation) of each model on a bundled dataset,
    with the models' published settings: the kernels and argument types of a full training."""
    import torch

    from . import datasets
    from .nn import models, train

    data = datasets.load(dataset)
    x, y, *masks = train.node_tensors(data)
    for name in model_names:
        model_class = models.MODELS[name]
        torch.manual_seed(0)
        model = model_class(x.shape[1], out_channels=data.num_classes,
                            **model_class.architecture)
        settings = dict(model_class.training, epochs=1)
        train.fit(model, x, data.adj, y, masks, progress=False, **settings)


WORKLOADS = {"gnn": _gnn_epochs}


def compile_ahead(workload, *args):
    """Start compiling ``workload``'s kernels in a helper process, unless they are all cached.

    The workload first runs here on cached kernels only (`runs_cached`), which on a warm cache
    is the whole check; the helper starts only when it meets a kernel that is not cached.

    Returns
    -------
    CompileAhead or None
        The helper to `CompileAhead.wait` for before the job runs, or None when nothing needs
        compiling (or Numba's JIT is off).
    """
    from numba.core import config

    if config.DISABLE_JIT or runs_cached(WORKLOADS[workload], *args):
        return None
    return CompileAhead(workload, [str(a) for a in args])


def _main(argv):
    workload, *args = argv
    WORKLOADS[workload](*args)


if __name__ == "__main__":
    _main(sys.argv[1:])
