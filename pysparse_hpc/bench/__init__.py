"""Command-line benchmarks of pysparse_hpc against scipy, on the shared real matrices.

Run ``python -m pysparse_hpc.bench <command> --help``. Each command lives in its own module
(``convert``: format conversions); this package module owns only the timing primitives they
share, so every command measures the same way.
"""
import argparse
import gc
import math
import time

__all__ = ["MAX_TIMEOUT", "MAX_WIDTH", "best_times", "counted", "geometric_mean",
           "positive_int", "positive_width", "shown_ratio", "timeout_seconds", "write_outputs"]

#: The widest dense operand or hidden layer a command takes: far beyond any GNN's, and what
#: stops a mistyped width from failing only at its first allocation, with a traceback.
MAX_WIDTH = 1 << 14
#: The longest job timeout, in seconds: a subprocess waits in poll(), whose milliseconds must
#: fit a C int; a longer one fails with OverflowError when the first job starts.
MAX_TIMEOUT = (2 ** 31 - 1) // 1000


def counted(count, noun):
    """``"1 thread"``, ``"2 threads"``: ``count`` and ``noun``, plural unless it is 1."""
    return f"{count} {noun}{'' if count == 1 else 's'}"


def best_times(functions, repeat, warmup=1, statistic=min):
    """Best wall time of each callable over ``repeat`` calls, after ``warmup`` untimed calls.

    Calls are interleaved (one call of each function per round), so drifting machine load
    affects every function alike. The garbage collector is off during each timed call, as in
    `timeit`, and the result is freed after the clock stops.

    Parameters
    ----------
    functions : dict of str to callable
        Zero-argument callables, by label.
    repeat : int
        Timed calls of each function (at least 1).
    warmup : int, default 1
        Untimed calls of each function first (JIT compilation, caches, page faults).
    statistic : callable, default min
        Reduces each function's list of call times (``statistics.median`` where single calls
        are long enough that their spread is the machine's, not the clock's).

    Returns
    -------
    dict of str to float
        Seconds of the fastest call (or ``statistic`` of the calls), by label.
    """
    if repeat < 1:
        raise ValueError(f"repeat must be at least 1, got {repeat}")
    for fn in functions.values():
        for _ in range(warmup):
            fn()
    samples = {label: [] for label in functions}
    gc_was_enabled = gc.isenabled()
    try:
        for _ in range(repeat):
            for label, fn in functions.items():
                gc.disable()
                start = time.perf_counter()
                result = fn()
                elapsed = time.perf_counter() - start
                del result  # freed outside the timed region
                if gc_was_enabled:
                    gc.enable()
                samples[label].append(elapsed)
    finally:
        if gc_was_enabled:
            gc.enable()
    return {label: statistic(times) for label, times in samples.items()}


def geometric_mean(values):
    """Geometric mean of positive numbers (NaN for an empty sequence)."""
    values = list(values)
    if not values:
        return math.nan
    return math.exp(sum(math.log(v) for v in values) / len(values))


def shown_ratio(value, met, target, at_most=False, digits=2):
    """``value`` as a verdict line prints it, ``digits`` decimals.

    A miss that would round onto the target is rounded away from it instead (down for an "at
    least" target, up for an "at most" one), so that 3.996 against "at least 4" does not read
    as a 4.00 that failed, nor 2.004 against "at most 2" as a 2.00 that failed.

    Parameters
    ----------
    value : float
    met : bool
        Whether ``value`` meets the target.
    target : float
    at_most : bool, default False
        The target is an upper bound (``value <= target``), not a lower one.
    digits : int, default 2

    Returns
    -------
    str
    """
    shown = round(value, digits)
    if not met:
        scale = 10 ** digits
        if at_most and shown <= target:
            shown = math.ceil(value * scale) / scale
        elif not at_most and shown >= target:
            shown = math.floor(value * scale) / scale
    return f"{shown:.{digits}f}"


def positive_int(text):
    """argparse type: a positive integer, with a message that says what was given."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def positive_width(text):
    """argparse type: a positive integer of at most `MAX_WIDTH` (an operand's or a layer's
    width)."""
    value = positive_int(text)
    if value > MAX_WIDTH:
        raise argparse.ArgumentTypeError(f"expected a width of at most {MAX_WIDTH}, got {value}")
    return value


def timeout_seconds(text):
    """argparse type: a job timeout, a positive integer of at most `MAX_TIMEOUT` seconds."""
    value = positive_int(text)
    if value > MAX_TIMEOUT:
        raise argparse.ArgumentTypeError(f"expected at most {MAX_TIMEOUT} seconds (24 days), "
                                         f"got {value}")
    return value


def positive_float(text):
    """argparse type: a finite number above 0, with a message that says what was given."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {value}")
    return value


def write_outputs(args, out, results, write_csv, write_plot, *details):
    """Write the CSV (``--csv``) and the plot (``--plot``) a command was asked for, each as
    ``write_x(results, path, *details)``, and say where on ``out``."""
    for path, write in ((args.csv, write_csv), (args.plot, write_plot)):
        if path:
            write(results, path, *details)
            print(f"wrote {path}", file=out)
