"""Checkpoints of (distributed) training: asynchronous, atomic, verified, reloadable at another
number of ranks.

This package owns the checkpoint directory. `Checkpointer` (``checkpointer``) lays it out,
saves in the background, commits a checkpoint by its manifest, keeps the last few and chooses
(with every rank's agreement) the newest checkpoint that verifies on load; ``_format`` is the
file format of the state files, ``_files`` writes files atomically and verifies them against
the manifest, ``_nodes`` gathers per-node state by node id, ``_rng`` holds the random
generators' states.

Layout::

    DIR/CHECKPOINTS                 marks DIR as a checkpoint directory (and holds the run's
                                    fingerprint)
    DIR/step-000000010/
        rank-00000.ckpt ...         each rank's own state (``shard``)
        nodes-00000.ckpt ...        each rank's per-node rows and their global node ids
        shared.ckpt                 replicated state, written once by rank 0
        manifest.json               written last, by rank 0: the size of every file and the
                                    SHA-256 of each of its 16 MiB blocks

A checkpoint exists once its manifest does. Every file is written under a temporary name in
its directory, flushed, fsync'd, renamed over its final name, and the directory fsync'd, so a
crash leaves either the old file or the new one, never a mixture.

A state file is ``MAGIC``, the length of a JSON header (little-endian uint64), the header, and
a payload of raw array bytes (each array at a 64-byte aligned offset). The header describes the
nested state (dicts, lists, tuples, plain values) with every tensor and array as a dtype, a
shape and a byte range of the payload: loading runs no pickle, so a checkpoint from elsewhere
cannot run code, and arrays come back bit for bit.
"""
from ._nodes import gather_node_rows
from ._rng import restore_rng_states, rng_states
from .checkpointer import Checkpoint, Checkpointer

__all__ = ["Checkpoint", "Checkpointer", "gather_node_rows", "restore_rng_states", "rng_states"]
