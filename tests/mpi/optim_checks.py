"""Optimizer checks under ``mpiexec -n P`` (launched by tests/test_optim_mpi.py); the same
conventions as checks.py: ``python optim_checks.py NAME [NAME ...]``, rank 0 prints
``PASSED NAME`` after each check that passed on every rank.
"""
import copy
import sys
from pathlib import Path

import numpy as np
import torch

from checks import (ALONE, checks_in, comm, on_root_then_broadcast, raises_on_every_rank,
                    rank, run_named, size)

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from faults import NanInEpoch  # noqa: E402
from reference import reference_lion_step_direction  # noqa: E402

from pysparse_hpc.optim import COMPRESSIONS, DistributedLion, Lion, bytes_per_step  # noqa: E402
from pysparse_hpc.optim.distributed_lion import (  # noqa: E402
    GRADIENT_KIND, MOMENTUM_KIND, VOTE_KIND)
from pysparse_hpc.optim.lion import interpolate  # noqa: E402

LR, DECAY, BETA1 = 1e-2, 0.1, 0.9
EXAMPLES = 30


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(),
                               torch.nn.Linear(16, 3)).double()


def _batch(rows, step):
    generator = torch.Generator().manual_seed(step)
    data = torch.randn(EXAMPLES, 8, dtype=torch.float64, generator=generator)
    target = torch.randint(0, 3, (EXAMPLES,), generator=generator)
    return data[rows], target[rows]


def _flat(tensors):
    return torch.cat([t.detach().reshape(-1) for t in tensors])


def _lion_run(optimizer_for, rows, steps, on_step=None):
    """``steps`` steps of the MLP on ``rows`` of each step's batch (mean loss over them)."""
    model = _model()
    optimizer = optimizer_for(model)
    for step in range(steps):
        optimizer.zero_grad()
        data, target = _batch(rows, step)
        torch.nn.functional.cross_entropy(model(data), target).backward()
        before = on_step(model, optimizer) if on_step else None
        optimizer.step()
        if on_step:
            on_step(model, optimizer, before)
    return model, optimizer


def check_lion_modes():
    """Every compression and momentum synchronisation on a batch split over the ranks: the
    step follows the plain reference's agreed direction from every rank's votes, parameters
    stay equal on every rank, the bytes equal `bytes_per_step`, and the uncompressed mode is
    one-process Lion on the whole batch."""
    mine = np.array_split(np.arange(EXAMPLES), size)[rank]
    steps = 4
    for compression in COMPRESSIONS:
        syncs = ("local",) if compression == "none" else ("local", "always", "growing")
        for sync in syncs:
            label = f"{compression}/{sync}"

            def follow_reference(model, optimizer, before=None):
                params = list(model.parameters())
                if before is None:  # ahead of the step: every rank's c, the parameters
                    directions = _flat(interpolate(optimizer.momentum(p), p.grad, BETA1)
                                       for p in params).numpy()
                    return comm.allgather(directions), _flat(params), optimizer.steps_taken
                if compression == "none":
                    return
                directions, start, step = before
                agreed = reference_lion_step_direction(
                    directions, [p.numel() for p in params], compression, step)
                expected = start * (1 - LR * DECAY) - LR * torch.from_numpy(agreed)
                torch.testing.assert_close(_flat(params), expected, rtol=0, atol=1e-12,
                                           msg=label)

            comm.reset_stats()
            model, optimizer = _lion_run(
                lambda m: DistributedLion(m.parameters(), comm, lr=LR, weight_decay=DECAY,
                                          compression=compression, momentum_sync=sync),
                mine, steps, follow_reference)
            params = _flat(model.parameters())
            everyone = comm.allgather(params.numpy())
            assert all(np.array_equal(everyone[0], p) for p in everyone), label
            stats = comm.stats()
            kind = GRADIENT_KIND if compression == "none" else VOTE_KIND
            counted = stats.get(kind, {"bytes_sent": 0, "bytes_received": 0})
            formula = steps * bytes_per_step(compression, params.numel(), size, rank=rank,
                                             itemsize=8)
            assert counted["bytes_sent"] == counted["bytes_received"] == formula, \
                (label, counted, formula)
            momenta = _flat(optimizer.momentum(p) for p in model.parameters()).numpy()
            synced = stats.get(MOMENTUM_KIND, {}).get("bytes_sent", 0)
            if sync == "local" or size == 1:  # one rank's momentum is everyone's already
                assert synced == 0 and optimizer.momentum_syncs == 0, label
            else:
                assert optimizer.momentum_syncs == steps  # growing: every step at first
                assert synced == steps * momenta.nbytes, label
                everyone = comm.allgather(momenta)
                assert all(np.array_equal(everyone[0], m) for m in everyone), label
            if compression == "none":
                reference = on_root_then_broadcast(lambda: _flat(_lion_run(
                    lambda m: Lion(m.parameters(), lr=LR, weight_decay=DECAY),
                    np.arange(EXAMPLES), steps)[0].parameters()))
                torch.testing.assert_close(params, reference, rtol=1e-10, atol=1e-12)


def check_lion_rows_without_gradient():
    """An ``Embedding(sparse=True)`` looked up alike on every rank: the rows looked up step
    as one process's Lion, and a row no gradient has reached (c exactly 0 everywhere) does
    not drift. In the sign formats the ranks split their votes there: on an even number of
    ranks the vote ties and the row stays, as with Lion; on an odd number, and in ``1bit``
    (which cannot say 0), it moves up and down on alternate steps."""
    def steps_of(optimizer_for, steps):
        torch.manual_seed(0)
        table = torch.nn.Embedding(12, 3, sparse=True).double()
        optimizer = optimizer_for(table.parameters())
        for step in range(steps):
            optimizer.zero_grad()
            table(torch.tensor([1, 3, 3, 5 + step])).pow(2).sum().backward()
            optimizer.step()
        return table.weight.detach()

    start = steps_of(lambda params: Lion(params, lr=LR), 0)
    for steps in (4, 5):
        lion = steps_of(lambda params: Lion(params, lr=LR), steps)
        never = slice(5 + steps, None)  # rows 5 + steps.. were never looked up
        for compression in COMPRESSIONS:
            got = steps_of(lambda params: DistributedLion(params, comm, lr=LR,
                                                          compression=compression), steps)
            label = f"{compression}, {steps} steps"
            torch.testing.assert_close(got[[1, 3]], lion[[1, 3]], rtol=0, atol=1e-12,
                                       msg=label)
            stays = (compression in ("none", "int8") or size == 1 or steps % 2 == 0
                     or (size % 2 == 0 and compression != "1bit"))
            moved = (got[never] - start[never]).abs()
            expected = 0.0 if stays else LR
            assert torch.allclose(moved, torch.full_like(moved, expected), rtol=0,
                                  atol=1e-12), (label, moved)


def _heads_model():
    torch.manual_seed(0)
    return torch.nn.ModuleDict({
        "body": torch.nn.Linear(8, 16),
        "heads": torch.nn.ModuleList(torch.nn.Linear(16, 3) for _ in range(3))}).double()


def _heads_loss(model, on_rank, step):
    """Rank ``on_rank``'s loss: its rows through head ``on_rank % 2``; head 2 is never used.
    At step 1 the last rank computes none (no gradient at all there)."""
    if step == 1 and on_rank == size - 1:
        return None
    data, target = _batch(np.arange(on_rank, EXAMPLES, size), step)
    hidden = torch.tanh(model["body"](data))
    return torch.nn.functional.cross_entropy(model["heads"][on_rank % 2](hidden), target)


def check_lion_unused_parameters():
    """Ranks whose backward reaches different parameters (one head per rank, one head on no
    rank, a rank with no gradient at all): no mode hangs or lets the replicas drift, the head
    no rank used stays where it was, and uncompressed the step is one process's Lion on the
    mean of the ranks' losses."""
    from pysparse_hpc.optim.distributed_lion import PARTICIPATION_KIND
    steps = 3
    for compression in COMPRESSIONS:
        model = _heads_model()
        unused = _flat(model["heads"][2].parameters()).clone()
        optimizer = DistributedLion(model.parameters(), comm, lr=LR, weight_decay=DECAY,
                                    compression=compression)
        comm.reset_stats()
        for step in range(steps):
            optimizer.zero_grad()
            loss = _heads_loss(model, rank, step)
            if loss is not None:
                loss.backward()
            optimizer.step()
        params = _flat(model.parameters()).numpy()
        everyone = comm.allgather(params)
        assert all(np.array_equal(everyone[0], p) for p in everyone), compression
        assert torch.equal(_flat(model["heads"][2].parameters()), unused), compression
        flags = comm.stats().get(PARTICIPATION_KIND, {}).get("bytes_sent", 0)
        assert flags == (steps * 8 if size > 1 else 0), (compression, flags)  # 8 tensors
        if compression == "none":
            def one_process():
                model = _heads_model()
                lion = Lion(model.parameters(), lr=LR, weight_decay=DECAY)
                for step in range(steps):
                    lion.zero_grad()
                    losses = [_heads_loss(model, r, step) for r in range(size)]
                    losses = [loss for loss in losses if loss is not None]
                    if losses:
                        (sum(losses) / size).backward()
                    lion.step()
                return _flat(model.parameters())
            reference = on_root_then_broadcast(one_process)
            torch.testing.assert_close(torch.from_numpy(params), reference, rtol=1e-10,
                                       atol=1e-12)


def _mixed_params():
    """Parameters of float64, float32 and bfloat16 in three groups of their own lr, betas and
    weight decay, of sizes that fill no packing lane."""
    generator = torch.Generator().manual_seed(5)
    params = [torch.nn.Parameter(torch.randn(n, dtype=torch.float64, generator=generator)
                                 .to(dtype))
              for n, dtype in ((7, torch.float64), (33, torch.float32), (65, torch.float32),
                               (9, torch.bfloat16), (0, torch.float32))]
    groups = [dict(params=params[:2], lr=LR, betas=(0.9, 0.99), weight_decay=DECAY),
              dict(params=params[2:4], lr=3e-3, betas=(0.5, 0.9), weight_decay=0.0),
              dict(params=params[4:], lr=2e-2, betas=(0.8, 0.95), weight_decay=0.3)]
    return params, groups


def _mixed_grads(params, on_rank, step):
    generator = torch.Generator().manual_seed(100 * step + on_rank)
    return [torch.randn(p.shape, dtype=torch.float64, generator=generator).to(p.dtype)
            for p in params]


def _step_on_mixed_grads(optimizer, params, steps):
    """``steps`` steps of ``optimizer`` on this rank's `_mixed_grads`, counters reset first."""
    comm.reset_stats()
    for step in range(steps):
        for param, grad in zip(params, _mixed_grads(params, rank, step)):
            param.grad = grad
        optimizer.step()


def check_lion_mixed_dtypes():
    """Parameters of three dtypes in groups of their own settings: uncompressed, P ranks take
    one process's Lion step on the mean gradient, and each dtype crosses at its own size (a
    float32 gradient or momentum as 4 bytes, not promoted to float64 by a float64 parameter;
    bfloat16 as float32), as `bytes_per_step` says per dtype."""
    steps = 3
    wire = {torch.float64: 8, torch.float32: 4, torch.bfloat16: 4}
    params, groups = _mixed_params()
    expected_bytes = sum(bytes_per_step("none", p.numel(), size, rank=rank,
                                        itemsize=wire[p.dtype]) for p in params)
    optimizer = DistributedLion(groups, comm, compression="none")
    _step_on_mixed_grads(optimizer, params, steps)
    counted = comm.stats().get(GRADIENT_KIND, {"bytes_sent": 0})["bytes_sent"]
    assert counted == steps * expected_bytes, (counted, steps * expected_bytes)

    def one_process():
        alone, groups = _mixed_params()
        lion = Lion(groups)
        for step in range(steps):
            every = [_mixed_grads(alone, r, step) for r in range(size)]
            for index, param in enumerate(alone):
                param.grad = (sum(g[index].double() for g in every) / size).to(param.dtype)
            lion.step()
        return [p.detach().double() for p in alone]
    reference = on_root_then_broadcast(one_process)
    for param, expected in zip(params, reference):
        tolerance = {torch.float64: 1e-12, torch.float32: 1e-6, torch.bfloat16: 1e-2}
        torch.testing.assert_close(param.detach().double(), expected, rtol=0,
                                   atol=tolerance[param.dtype], msg=str(param.dtype))
    params, groups = _mixed_params()
    optimizer = DistributedLion(groups, comm, compression="votes", momentum_sync="always")
    _step_on_mixed_grads(optimizer, params, steps)
    synced = comm.stats().get(MOMENTUM_KIND, {"bytes_sent": 0})["bytes_sent"]
    per_sync = 0 if size == 1 else sum(p.numel() * wire[p.dtype] for p in params)
    assert synced == steps * per_sync, (synced, steps * per_sync)
    everyone = comm.allgather(torch.cat([p.detach().double() for p in params]).numpy())
    assert all(np.array_equal(everyone[0], p) for p in everyone)


def check_lion_refuses_unlike_ranks():
    """A bad setting on one rank raises on every rank, and ranks that build unlike optimizers
    (another mode, rate or parameter) are refused by name. Before, the bad setting raised on
    its rank alone while the others waited in their first step, another rate drifted the
    replicas apart without a word, and another parameter shape paired the collectives
    wrongly."""
    last = rank == size - 1

    def build(params=None, **settings):
        return DistributedLion(_model().parameters() if params is None else params, comm,
                               **settings)
    raises_on_every_rank(lambda: build(compression="sings" if last else "signs"),
                         "compression must be one of")
    raises_on_every_rank(lambda: build(compression="int8" if last else "votes"),
                         "rank 0 has compression votes where rank")
    raises_on_every_rank(lambda: build(lr=2e-4 if last else 1e-4),
                         "group 0 lr 0.0001 where rank")
    wide = torch.nn.Linear(4, 3 if last else 2)
    raises_on_every_rank(lambda: build(wide.parameters()), "unlike DistributedLion")
    build(lr=1e-4, compression="votes")  # alike: built
    # With decoupled decay the constructor's lr scales the decay of every group, even one
    # with its own lr: compared too. Both were not, and the replicas parted.
    groups = [{"params": list(_model().parameters()), "lr": 1e-3}]
    raises_on_every_rank(lambda: build(groups, lr=1e-2, weight_decay=0.1,
                                       decoupled_weight_decay=not last),
                         "decoupled_weight_decay True where")
    raises_on_every_rank(lambda: build(groups, lr=2e-2 if last else 1e-2, weight_decay=0.1,
                                       decoupled_weight_decay=True),
                         "constructor lr 0.01 where")


def check_lion_refuses_ranks_that_parted():
    """Ranks whose optimizers part after construction (a group added, a state loaded or a
    rate changed on some ranks only) are refused by name at their next step, on every rank.
    Before, the participation allreduce failed inside MPI ("Message truncated"), or the
    replicas parted without a word (another rate; another step count in the 1-bit mode's
    tie mask)."""
    last = rank == size - 1

    def stepped(optimizer, model, steps):
        for step in range(steps):
            optimizer.zero_grad()
            data, target = _batch(slice(rank, None, size), step)
            torch.nn.functional.cross_entropy(model(data), target).backward()
            optimizer.step()

    def parted(change, message, compression="votes"):
        model = _model()
        optimizer = DistributedLion(model.parameters(), comm, lr=LR, compression=compression)
        stepped(optimizer, model, 2)
        saved = optimizer.state_dict()
        stepped(optimizer, model, 1)
        if last:
            change(optimizer, saved)
        raises_on_every_rank(lambda: stepped(optimizer, model, 1), message)

    parted(lambda optimizer, saved: optimizer.add_param_group(
        {"params": [torch.nn.Parameter(torch.zeros(3, dtype=torch.float64))]}),
        "differ in the number of parameters")
    parted(lambda optimizer, saved: optimizer.param_groups[0].update(lr=LR / 2),
           "differ in the parameter groups' settings")
    parted(lambda optimizer, saved: optimizer.load_state_dict(saved), "differ in the steps taken",
           compression="1bit")
    # A rate wrong on some ranks only raised there alone, while the others waited.
    parted(lambda optimizer, saved: optimizer.param_groups[0].update(lr=float("nan")),
           "differ in the parameter groups' settings")
    model = _model()   # alike on every rank: the steps go on
    # the same rate as another type, and keys of the user's own that differ, are alike
    optimizer = DistributedLion([{"params": list(model.parameters()), "name": f"rank {rank}",
                                  "lr": np.float64(LR) if rank else LR}], comm, lr=LR)
    stepped(optimizer, model, 2)
    optimizer.add_param_group({"params": [torch.nn.Parameter(torch.zeros(3))]})
    optimizer.load_state_dict(optimizer.state_dict())
    stepped(optimizer, model, 1)


def check_lion_refuses_replicas_that_start_apart():
    """Parameters that differ between the ranks at the first step (a model built from each
    rank's own seed) are refused by name on every rank; before, every rank applied the same
    update to its own weights and the replicas stayed apart without a word. Unlike settings
    at that step are still named as such, and equal replicas step on."""
    last = rank == size - 1

    def first_step(model, **settings):
        optimizer = DistributedLion(model.parameters(), comm, **settings)
        data, target = _batch(slice(rank, None, size), 0)
        torch.nn.functional.cross_entropy(model(data), target).backward()
        optimizer.step()
        return optimizer

    def apart():
        model = _model()
        with torch.no_grad():
            model[2].bias[1] += 1e-12 if last else 0.0   # one value, one rank
        return model

    for compression in ("none", "votes"):
        raises_on_every_rank(lambda: first_step(apart(), lr=LR, compression=compression),
                             "parameters differ at DistributedLion's first step")
    model = apart()
    optimizer = DistributedLion(model.parameters(), comm, lr=LR)
    optimizer.param_groups[0]["lr"] = LR / 2 if last else LR
    data, target = _batch(slice(rank, None, size), 0)
    torch.nn.functional.cross_entropy(model(data), target).backward()
    raises_on_every_rank(optimizer.step, "differ in the parameter groups' settings or shapes")
    # a copy made before the first step, stepped on one rank only: that rank's digest covers
    # the values where the others' do not, and the comparison that tells them from the
    # settings must be made on every rank or none (it hung rank 0)
    model = _model()
    optimizer = DistributedLion(model.parameters(), comm, lr=LR)
    spare = copy.deepcopy(optimizer)
    data, target = _batch(slice(rank, None, size), 0)
    torch.nn.functional.cross_entropy(model(data), target).backward()
    optimizer.step()
    raises_on_every_rank((spare if rank == 0 else optimizer).step, "differ in the steps taken")
    model = _model()   # alike: the steps go on, the values checked once
    optimizer = first_step(model, lr=LR, compression="votes")
    assert not optimizer._values_unchecked
    flat = _flat(model.parameters())
    gathered = comm.allgather(flat.numpy())
    assert all(np.array_equal(gathered[0], other) for other in gathered)


def check_lion_training():
    """``train(optimizer="lion")``: uncompressed, P ranks give the one-rank losses (float64);
    every compressed mode trains and reports its vote bytes."""
    from pysparse_hpc.distributed.training import train
    options = dict(epochs=3, dtype="float64", progress=False, optimizer="lion")
    reference = on_root_then_broadcast(
        lambda: train("cora", "gcn", "contiguous", comm=ALONE, **options))
    result = train("cora", "gcn", "metis", comm=comm, **options)
    np.testing.assert_allclose(result.losses, reference.losses, rtol=1e-10)
    assert result.optimizer == "lion"
    assert (result.optimizer_bytes_per_epoch > 0) == (size > 1)  # one rank sends nothing
    for compression in COMPRESSIONS[1:]:
        result = train("cora", "gcn", "metis", comm=comm, compression=compression, **options)
        assert result.compression == compression
        assert (result.optimizer_bytes_per_epoch > 0) == (size > 1)
        assert result.losses[-1] < result.losses[0], (compression, result.losses)


def check_nonfinite_step_skipped_everywhere():
    """A NaN loss on one rank: every rank skips that step (with Adam's allreduce and with
    Lion's votes), the replicas stay equal and finite, training goes on."""
    import warnings

    import pysparse_hpc as sph
    from pysparse_hpc.distributed import DistGraph, partition
    from pysparse_hpc.nn import models
    from pysparse_hpc.nn.train import fit, node_tensors
    cora = sph.datasets.load("cora")
    graph = DistGraph(cora.adj, partition(cora.adj, size, "contiguous"), comm)
    x, y, *masks = (torch.from_numpy(graph.scatter_rows(t.numpy()))
                    for t in node_tensors(cora))
    for optimizer in ("adam", "lion"):
        torch.manual_seed(0)
        model = NanInEpoch(models.GCN(x.shape[1], 16, cora.num_classes), epoch=1,
                           poisoned=rank == size - 1)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = fit(model, x, graph, y, masks, epochs=4, progress=False,
                         optimizer=optimizer,
                         compression="none" if optimizer == "adam" else "votes")
        assert result.skipped_epochs == [1], result.skipped_epochs
        assert np.isfinite(result.losses[3])
        if rank == 0:
            assert any(f"{size - 1}; step skipped on every rank" in str(w.message)
                       for w in caught), \
                [str(w.message) for w in caught]
        params = _flat(model.parameters()).numpy()
        assert np.isfinite(params).all()
        everyone = comm.allgather(params)
        assert all(np.array_equal(everyone[0], p) for p in everyone), optimizer


if __name__ == "__main__":
    run_named(checks_in(globals()), sys.argv[1:])
