"""Train GCN, GAT and AGNN node classifiers on Cora or CiteSeer, optionally reordering the graph.

Each model is trained full batch with its published hyper-parameters (`pysparse_hpc.nn.models`);
the script prints the test accuracy at the best validation epoch and the time per training
epoch. With ``--reorder rabbit`` (or rcm, degree) the nodes are renumbered first, so the blocked
kernels see denser 8x1 vectors: the adjacency is permuted as ``P A P^T`` and the features,
labels and split masks follow as ``x[perm]``. The model does not depend on the numbering, but
its dropout masks follow the node ids, so a renumbered run draws other masks: the accuracy is
the same in distribution (within a point or so on Cora), not run for run. ``--format mebcrs``
runs the SpMMs on the ME-BCRS kernel, where the order matters most.

Run it with ``python examples/train_gnn.py [--dataset citeseer] [--model gcn ...]
[--reorder rabbit] [--format mebcrs] [--epochs N]``.
"""
import argparse
import sys

import torch

import pysparse_hpc as sph
from pysparse_hpc.nn import models, train


def reordered(adj, tensors, method):
    """The graph and node tensors in the order ``sph.reorder(adj, method)`` gives."""
    perm = sph.reorder(adj, method=method)
    before, after = sph.block_stats(adj), sph.block_stats(sph.permute(adj, perm))
    print(f"{method} order: 8x1 vectors {before.n_vectors} -> {after.n_vectors} "
          f"({before.n_vectors / after.n_vectors:.2f}x fewer)")
    index = torch.from_numpy(perm)
    return sph.permute(adj, perm), [t[index] for t in tensors]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="cora", choices=sph.datasets.available())
    parser.add_argument("--model", nargs="+", default=["gcn", "gat", "agnn"],
                        choices=sorted(models.MODELS))
    parser.add_argument("--reorder", default="none", choices=("none", "rabbit", "rcm", "degree"))
    parser.add_argument("--format", default="csr", choices=("csr", "mebcrs"))
    parser.add_argument("--epochs", type=int, help="default: the model's published setting")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.epochs is not None and args.epochs < 1:
        parser.error(f"--epochs must be at least 1, got {args.epochs}")

    data = sph.datasets.load(args.dataset)
    print(data)
    adj, tensors = data.adj, list(train.node_tensors(data))
    if args.reorder != "none":
        adj, tensors = reordered(adj, tensors, args.reorder)
    graph = adj.to_mebcrs() if args.format == "mebcrs" else adj
    x, y, *masks = tensors
    for name in args.model:
        model_class = models.MODELS[name]
        # Not `if args.epochs`: that read a refused 0 as "the published setting".
        settings = dict(model_class.training,
                        **({} if args.epochs is None else {"epochs": args.epochs}))
        torch.manual_seed(args.seed)
        model = model_class(x.shape[1], out_channels=data.num_classes, **model_class.architecture)
        result = train.fit(model, x, graph, y, masks, **settings, description=name)
        print(f"{name.upper():<5} test accuracy {100 * result.test_accuracy:5.1f}% "
              f"(best validation epoch {result.best_epoch + 1}), "
              f"{1e3 * result.seconds_per_epoch:.1f} ms per training epoch")
    return 0


if __name__ == "__main__":
    sys.exit(main())
