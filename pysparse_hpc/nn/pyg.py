"""State dicts for PyG: a model built from this library's layers, saved for the same model built
from PyG's.

The layers take PyG's parameter names, and PyG's state dicts load into them as they are. The
one difference in layout is `GATConv`'s attention vectors: ``(heads, out_channels)`` here, which
is what preconditioners treat as a matrix, ``(1, heads, out_channels)`` in PyG.
"""
import torch

from .gat import GATConv

__all__ = ["to_pyg_state_dict"]


def to_pyg_state_dict(model):
    """``model.state_dict()`` in PyG's layout: loads into the same model built from PyG's layers.

    Parameters
    ----------
    model : torch.nn.Module
        A model, or one layer, built from this library's layers (and any torch modules).

    Returns
    -------
    dict
        The state dict with each `GATConv`'s ``att_src`` and ``att_dst`` given PyG's leading
        axis of 1 (a view: no copy); every other entry as ``model.state_dict()`` holds it.

    Examples
    --------
    >>> import torch, pysparse_hpc as sph
    >>> from torch_geometric.nn import GATConv as PygGATConv
    >>> ours = sph.nn.GATConv(5, 3, heads=2)
    >>> theirs = PygGATConv(5, 3, heads=2)
    >>> theirs.load_state_dict(sph.nn.to_pyg_state_dict(ours))
    <All keys matched successfully>
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__} (for a "
                        "state dict alone, load it into the model first: which entries are "
                        "GATConv's attention vectors depends on the model)")
    state = model.state_dict()
    for prefix, module in model.named_modules(remove_duplicate=False):
        if not isinstance(module, GATConv):
            continue
        for name in ("att_src", "att_dst"):
            key = f"{prefix}.{name}" if prefix else name
            if key in state and state[key].dim() == 2:
                state[key] = state[key].unsqueeze(0)
    return state
