"""One run of each GPU SpMM contender on one matrix, between CUDA profiler start and stop.

Run it under Nsight Compute to see where the kernels' time goes (achieved memory bandwidth
against the device's, occupancy, warp stalls); the compilations, transfers and warm-up runs
happen before the profiler starts, so only the timed kernels are captured::

    ncu --profile-from-start off --set full -o spmm \\
        python -m pysparse_hpc.bench.spmm_cuda_profile --rmat 20:16 --n 128

Without ``ncu`` it just runs each contender once (a quick check that all of them work).
"""
import argparse

import numpy as np


def _matrix(args):
    if args.rmat:
        from ..generators import rmat
        scale, edge_factor = (int(part) for part in args.rmat.split(":")[:2])
        return rmat(scale, edge_factor, seed=1).astype(np.float32, copy=False)
    from ._data import data_dir, find_matrices, load_matrix
    specs = {spec.name: spec for spec in find_matrices(data_dir(args.data))[0]}
    if args.matrix not in specs:
        raise SystemExit(f"error: no shared matrix {args.matrix!r}; there are {sorted(specs)}")
    return load_matrix(specs[args.matrix]).astype(np.float32, copy=False)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m pysparse_hpc.bench.spmm_cuda_profile",
                                     description=__doc__.splitlines()[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--rmat", metavar="SCALE:EF", help="an R-MAT graph (seed 1)")
    source.add_argument("--matrix", metavar="NAME", help="a shared matrix")
    parser.add_argument("--data", metavar="DIR", help="shared data directory")
    parser.add_argument("--n", type=int, default=128, help="width N of B (default: 128)")
    args = parser.parse_args(argv)

    import torch

    from .spmm_cuda import _torch_cuda, measure, prepare
    from .._cuda_backend import require_gpu

    try:
        cuda = require_gpu()
    except RuntimeError as exc:  # one error line and status 2, as the other bench commands
        parser.exit(2, f"error: {exc}\n")
    operands, _, _ = prepare(_matrix(args), cuda, _torch_cuda())

    class _Once:
        simulated = False

        @staticmethod
        def median_seconds(function, repeat):
            function()  # warm-up (compilation) outside the profiled range
            cuda.synchronize()
            torch.cuda.profiler.start()
            function()
            cuda.synchronize()
            torch.cuda.profiler.stop()
            return 0.0

    notes = []
    measure(operands, args.n, 1, _Once(), "profile", notes)
    for note in notes:
        print(note)
    print("profiled:", ", ".join(operands["launchers"]) + ", " + ", ".join(operands["tensors"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
