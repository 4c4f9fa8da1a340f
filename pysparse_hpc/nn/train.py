"""Full-batch node classification: train, select the epoch by validation accuracy, test.

Shared by ``python -m pysparse_hpc demo``, the examples and the GNN benchmark, so every model
(ours and PyG's) is trained and timed the same way.
"""
import time
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

__all__ = ["TrainResult", "fit", "node_tensors", "normalize_features"]


@dataclass
class TrainResult:
    """What `fit` measured.

    Attributes
    ----------
    test_accuracy, val_accuracy : float
        At the epoch of best validation accuracy (ties: lower validation loss).
    best_epoch : int
    seconds_per_epoch : float
        Median time of one training step (forward, backward, optimizer step), evaluation
        excluded.
    epochs : int
    """

    test_accuracy: float
    val_accuracy: float
    best_epoch: int
    seconds_per_epoch: float
    epochs: int


def normalize_features(x):
    """Rows scaled to sum 1 (Kipf and Welling's preprocessing); all-zero rows stay zero."""
    x = np.asarray(x, dtype=np.float32)
    sums = x.sum(axis=1, keepdims=True)
    return np.divide(x, sums, out=np.zeros_like(x), where=sums != 0)


def node_tensors(data, dtype=torch.float32):
    """``(x, y, train_mask, val_mask, test_mask)`` of a `pysparse_hpc.datasets.Dataset` as
    tensors, features row-normalized."""
    x = torch.from_numpy(normalize_features(data.x)).to(dtype)
    masks = [torch.from_numpy(np.asarray(m, dtype=bool)) for m in
             (data.train_mask, data.val_mask, data.test_mask)]
    return (x, torch.from_numpy(np.asarray(data.y, dtype=np.int64)), *masks)


def _accuracy(logits, y, mask):
    return float((logits[mask].argmax(dim=1) == y[mask]).float().mean())


def fit(model, x, adj, y, masks, *, epochs=200, lr=0.01, weight_decay=5e-4, progress=True,
        description="training"):
    """Train ``model(x, adj)`` with Adam and cross-entropy on the training nodes.

    Parameters
    ----------
    model : torch.nn.Module
        Called as ``model(x, adj)``; a ``param_groups(weight_decay)`` method, when present,
        sets per-layer weight decay.
    x : torch.Tensor
    adj : object
        Whatever the model takes as its graph.
    y : torch.Tensor of int64
    masks : (train, val, test) boolean tensors
    epochs : int
    lr, weight_decay : float
    progress : bool
        Show a progress bar (tqdm) with the loss and validation accuracy.

    Returns
    -------
    TrainResult
    """
    from tqdm.auto import tqdm

    train_mask, val_mask, test_mask = masks
    groups = (model.param_groups(weight_decay) if hasattr(model, "param_groups")
              else [dict(params=model.parameters(), weight_decay=weight_decay)])
    optimizer = torch.optim.Adam(groups, lr=lr)
    best = (-1.0, float("inf"), 0.0, -1)  # val accuracy, val loss, test accuracy, epoch
    step_seconds = []
    bar = tqdm(range(epochs), desc=description, disable=not progress, leave=False, mininterval=0.5)
    for epoch in bar:
        model.train()
        start = time.perf_counter()
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x, adj)[train_mask], y[train_mask])
        loss.backward()
        optimizer.step()
        step_seconds.append(time.perf_counter() - start)
        model.eval()
        with torch.no_grad():
            logits = model(x, adj)
            val_loss = float(F.cross_entropy(logits[val_mask], y[val_mask]))
            val_accuracy = _accuracy(logits, y, val_mask)
            if (val_accuracy, -val_loss) > (best[0], -best[1]):
                best = (val_accuracy, val_loss, _accuracy(logits, y, test_mask), epoch)
        bar.set_postfix(loss=f"{loss.item():.3f}", val=f"{val_accuracy:.3f}", refresh=False)
    bar.close()
    return TrainResult(test_accuracy=best[2], val_accuracy=best[0], best_epoch=best[3],
                       seconds_per_epoch=float(np.median(step_seconds)) if step_seconds
                       else float("nan"), epochs=epochs)
