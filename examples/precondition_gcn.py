"""Train a GCN on a citation graph with Adam, with Adam on gradients preconditioned by K-FAC,
Shampoo and Jorge, and with SGD (momentum 0.9) on K-FAC's.

The layers' dense transforms (``conv.lin``) are what the makers precondition. The first model
runs ASDL's loop written out, on the training nodes' rows of the output:

    dy = gm.setup_model_call(model, x, graph)
    gm.setup_loss_call(loss, dy[train_mask], y[train_mask])
    gm.forward_and_backward()
    opt.step()

and the others through ``pysparse_hpc.nn.train.fit(preconditioner=...)``, which runs the same
loop. The last hands K-FAC's direction to SGD with momentum, as Martens and Grosse do
(``fit(optimizer="sgd", preconditioner="kfac")``, lr 30x Adam's, damping 0.03): on Cora it
reaches its best validation accuracy in a fraction of Adam's epochs. Every run starts from the
same weights. Under ``mpiexec`` the same training is ``python -m pysparse_hpc train
--optimizer kfac [--base-optimizer sgd]``. Run it with
``python examples/precondition_gcn.py [--dataset cora|citeseer] [--epochs N]``.
"""
import argparse
import sys
import time

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

import pysparse_hpc as sph
from pysparse_hpc.nn import models, train
from pysparse_hpc.precondition import KfacGradientMaker, PreconditioningConfig


def explicit_kfac_loop(model, x, graph, y, train_mask, epochs, lr, weight_decay):
    """Adam on K-FAC-preconditioned gradients, the loop written out; seconds per epoch."""
    n_train = int(train_mask.sum())

    def loss(logits, labels, reduction="mean"):
        total = F.cross_entropy(logits, labels, reduction="sum")
        return total if reduction == "sum" else total / n_train

    config = PreconditioningConfig(data_size=n_train, damping=1e-2, curvature_upd_interval=10,
                                   preconditioner_upd_interval=10)
    gm = KfacGradientMaker(model, config, fisher_type="emp")
    opt = torch.optim.Adam(model.param_groups(weight_decay), lr=lr)
    start = time.perf_counter()
    # Six trainings of the full length follow: each shows a bar, so a slow one is seen to move.
    for _ in tqdm(range(epochs), desc="ASDL loop, K-FAC", leave=False):
        model.train()
        opt.zero_grad()
        dy = gm.setup_model_call(model, x, graph)
        gm.setup_loss_call(loss, dy[train_mask], y[train_mask])
        gm.forward_and_backward()
        opt.step()
    return (time.perf_counter() - start) / max(epochs, 1), sorted(gm.preconditioned_modules())


def label(optimizer, preconditioner):
    """The run's name in the table and on its progress bar: Adam, Adam on kfac, SGD on kfac."""
    name = optimizer.upper() if optimizer == "sgd" else optimizer.capitalize()
    return name if preconditioner is None else f"{name} on {preconditioner}"


def accuracy(model, x, graph, y, mask):
    model.eval()
    with torch.no_grad():
        return float((model(x, graph)[mask].argmax(1) == y[mask]).float().mean())


def main(argv=None):
    # The first paragraph: its first line ends mid-sentence.
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", default="cora", choices=sph.datasets.available())
    parser.add_argument("--epochs", type=int, default=200)
    args = parser.parse_args(argv)
    if args.epochs < 1:
        parser.error(f"--epochs must be at least 1, got {args.epochs}")
    data = sph.datasets.load(args.dataset)
    x, y, train_mask, val_mask, test_mask = train.node_tensors(data)
    settings = dict(models.GCN.training, epochs=args.epochs)

    def new_model():
        torch.manual_seed(0)
        return models.GCN(x.shape[1], out_channels=data.num_classes, **models.GCN.architecture)

    print(f"GCN on {data.name}, {args.epochs} epochs (Adam, the model's learning rate and "
          "weight decay)")
    model = new_model()
    seconds, modules = explicit_kfac_loop(model, x, data.adj, y, train_mask, args.epochs,
                                          settings["lr"], settings["weight_decay"])
    print(f"  the ASDL loop with K-FAC preconditions {modules}: final test accuracy "
          f"{100 * accuracy(model, x, data.adj, y, test_mask):.1f}%, "
          f"{1e3 * seconds:.1f} ms per epoch")
    sgd_settings = dict(settings, lr=settings["lr"] * train.SGD_LR_SCALING["kfac"])
    for optimizer, preconditioner in (("adam", None), ("adam", "kfac"), ("adam", "shampoo"),
                                      ("adam", "jorge"), ("sgd", "kfac")):
        result = train.fit(new_model(), x, data.adj, y, (train_mask, val_mask, test_mask),
                           preconditioner=preconditioner, optimizer=optimizer,
                           description=label(optimizer, preconditioner),
                           **(sgd_settings if optimizer == "sgd" else settings))
        print(f"  {label(optimizer, preconditioner):<16} test accuracy "
              f"{100 * result.test_accuracy:5.1f}% at the best validation epoch "
              f"{result.best_epoch + 1:4d}, {1e3 * result.seconds_per_epoch:6.1f} ms per epoch")
    return 0


if __name__ == "__main__":
    sys.exit(main())
