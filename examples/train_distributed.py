"""Train a GNN on a graph split over MPI ranks, step by step with the library's pieces.

Rank 0 reads the graph, partitions it (METIS by default; ``--partition rabbit``: the library's
rabbit reordering followed by contiguous blocks; ``--partition random``: random owners, the
worst case) and scatters each rank its rows and node data; every rank builds the same
model from the same seed and trains it on its rows with halo exchange. At the end rank 0
gathers the predictions of every node, compares them with the labels, and prints what the
exchanges cost.

Run it with ``mpiexec -n 2 python examples/train_distributed.py [--dataset citeseer]
[--model gat] [--partition rabbit] [--epochs N]``; without ``mpiexec`` it is a one-rank run.
"""
import argparse
import sys

import numpy as np
import torch

import pysparse_hpc as sph
from pysparse_hpc import distributed
from pysparse_hpc.nn import models, train


def split_graph(data, ranks, method):
    """``(adj, node arrays, partition)`` in the order the partition wants (rank 0 only)."""
    arrays = [train.normalize_features(data.x), data.y, data.train_mask, data.val_mask,
              data.test_mask]
    adj = data.adj
    if method == "rabbit":  # neighbours next to each other, then consecutive blocks
        perm = sph.reorder(adj, method="rabbit")
        adj, arrays = sph.permute(adj, perm), [a[perm] for a in arrays]
        return adj, arrays, distributed.partition(adj, ranks, "contiguous")
    return adj, arrays, distributed.partition(adj, ranks, method)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="cora", choices=sph.datasets.available())
    parser.add_argument("--model", default="gcn", choices=sorted(models.MODELS))
    parser.add_argument("--partition", default="metis", choices=("metis", "rabbit", "random"))
    parser.add_argument("--epochs", type=int, help="default: the model's published setting")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.epochs is not None and args.epochs < 1:
        # The same on every rank: each says it, and no rank waits for another.
        parser.error(f"--epochs must be at least 1, got {args.epochs}")

    comm = distributed.init()
    adj, arrays, parts, data = None, [None] * 5, None, None
    if comm.rank == 0:
        data = sph.datasets.load(args.dataset)
        adj, arrays, parts = split_graph(data, comm.size, args.partition)
        print(f"{data} on {comm.size} rank{'s' if comm.size > 1 else ''}\n{parts!r}")
    graph = distributed.DistGraph.scatter(adj, parts, comm)
    x, y, *masks = (torch.from_numpy(graph.scatter_rows(a)) for a in arrays)
    num_classes = comm.bcast(data.num_classes if data is not None else None)

    model_class = models.MODELS[args.model]
    settings = dict(model_class.training,
                    **({} if args.epochs is None else {"epochs": args.epochs}))
    torch.manual_seed(args.seed)  # the same weights on every rank
    model = model_class(x.shape[1], out_channels=num_classes, **model_class.architecture)
    comm.reset_stats()
    result = train.fit(model, x, graph, y, masks, **settings, progress=comm.rank == 0,
                       description=args.model)

    model.eval()
    with torch.no_grad():
        predicted = graph.gather_rows(model(x, graph).argmax(dim=1))  # None off rank 0
    halo = sum(comm.stats().get(kind, {}).get("bytes_received", 0)
               for kind in ("halo", "reverse_halo"))
    halo = graph.allreduce_sum(halo)
    if comm.rank == 0:
        labels, test_mask = arrays[1], arrays[4]
        final = float(np.mean(predicted[test_mask] == labels[test_mask]))
        print(f"{args.model.upper()}: test accuracy {100 * result.test_accuracy:.1f}% at the "
              f"best validation epoch {result.best_epoch + 1}, {100 * final:.1f}% after the "
              f"last; {1e3 * result.seconds_per_epoch:.1f} ms per training epoch; "
              f"{halo / settings['epochs'] / 1e6:.3f} MB of halo rows per epoch (all ranks)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
