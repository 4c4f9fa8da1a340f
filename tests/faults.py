"""Test doubles that fail on purpose."""
import torch


class NanInEpoch(torch.nn.Module):
    """``model`` whose training output turns NaN in one epoch (the ``epoch``-th training
    call), where ``poisoned`` is true (e.g. on one rank only)."""

    def __init__(self, model, epoch, poisoned=True):
        super().__init__()
        self.model, self.epoch, self.poisoned, self.calls = model, epoch, poisoned, 0

    def forward(self, x, adj):
        out = self.model(x, adj)
        if self.training:
            if self.calls == self.epoch and self.poisoned:
                out = out * float("nan")
            self.calls += 1
        return out
