"""The states of the global random generators, to save in a checkpoint and restore."""
import random

import numpy as np


def rng_states():
    """The states of Python's, NumPy's and torch's global random generators (torch's CUDA
    generators too when CUDA is in use), to save in a checkpoint.

    Returns
    -------
    dict
        ``{"python": ..., "numpy": ..., "torch": ..., "cuda": [...]}`` (``torch`` and ``cuda``
        only where torch is installed and CUDA initialised).
    """
    states = {"python": random.getstate(), "numpy": np.random.get_state()}
    try:
        import torch
    except ImportError:
        return states
    states["torch"] = torch.get_rng_state()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def restore_rng_states(states):
    """Set the global random generators to ``states`` (what `rng_states` returned).

    Parameters
    ----------
    states : dict
        Entries ``"python"``, ``"numpy"``, ``"torch"`` and ``"cuda"``, as `rng_states` made
        them; a generator whose entry is missing keeps its state.

    Raises
    ------
    ImportError
        ``states`` holds a torch or CUDA state and torch is not installed.
    """
    if "python" in states:
        version, internal, gauss = states["python"]
        random.setstate((version, tuple(internal), gauss))
    if "numpy" in states:
        np.random.set_state(states["numpy"])
    if "torch" in states or "cuda" in states:
        import torch
        if "torch" in states:
            torch.set_rng_state(states["torch"])
        if "cuda" in states:
            torch.cuda.set_rng_state_all(states["cuda"])
