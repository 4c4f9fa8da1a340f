"""The one-process side of distributed preconditioning: a one-rank communicator changes
nothing, bad arguments, KAISA's greedy owners and the flat-buffer sums (the multi-rank runs are
in tests/mpi/checks.py::check_precondition)."""
import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402

from pysparse_hpc import precondition as P  # noqa: E402
from pysparse_hpc.distributed import Communicator  # noqa: E402
from pysparse_hpc.precondition._kaisa import allreduce_sum, assign_owners  # noqa: E402


def _steps(maker, model, steps=3):
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(16, 6, dtype=torch.float64, generator=generator)
    t = torch.randint(0, 3, (16,), generator=generator)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    grads = []
    for _ in range(steps):
        optimizer.zero_grad()
        placeholder = maker.setup_model_call(model, x)
        maker.setup_loss_call(F.cross_entropy, placeholder, t)
        maker.forward_and_backward()
        grads.append([p.grad.clone() for p in model.parameters()])
        optimizer.step()
    return grads


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(),
                               torch.nn.Linear(5, 3)).double()


@pytest.mark.parametrize("strategy", ["inverse", "gradient"])
def test_a_one_rank_communicator_changes_nothing(strategy):
    config = P.PreconditioningConfig(data_size=16, damping=1e-3)
    alone = _steps(P.KfacGradientMaker(model := _mlp(), config, fisher_type="emp"), model)
    ranked = _steps(P.KfacGradientMaker(model := _mlp(), config, fisher_type="emp",
                                        comm=Communicator(None), strategy=strategy), model)
    for a, b in zip(alone, ranked):
        for x, y in zip(a, b):
            assert torch.equal(x, y)


def test_bad_distribution_arguments():
    config = P.PreconditioningConfig(data_size=16)
    with pytest.raises(ValueError, match="strategy must be one of"):
        P.KfacGradientMaker(_mlp(), config, strategy="owners")
    with pytest.raises(TypeError, match="comm must be a pysparse_hpc.distributed.Communicator"):
        P.KfacGradientMaker(_mlp(), config, comm=object())
    with pytest.raises(TypeError, match="comm must be"):
        P.ShampooGradientMaker(_mlp(), P.PreconditioningConfig(), comm="world")


def test_owners_are_greedy_by_cost():
    costs = {"a": 8.0, "b": 27.0, "c": 1.0, "d": 9.0, "e": 20.0}
    owners = assign_owners(costs, 2)
    assert list(owners) == list(costs)   # the modules' order is kept
    # b 27 -> 0; e 20 -> 1; d 9 -> 1 (20 < 27); a 8 -> 0 (27 < 29); c 1 -> 1 (29 < 35)
    assert owners == {"b": 0, "e": 1, "d": 1, "a": 0, "c": 1}
    assert set(assign_owners(costs, 1).values()) == {0}
    load = [sum(c for n, c in costs.items() if owners[n] == r) for r in (0, 1)]
    assert max(load) - min(load) <= max(costs.values())


def test_allreduce_sum_on_one_rank_keeps_every_tensor():
    tensors = [torch.arange(6.0).view(2, 3), torch.ones(2, dtype=torch.float32),
               torch.tensor([[5.0]], dtype=torch.float64)]
    before = [t.clone() for t in tensors]
    allreduce_sum(Communicator(None), tensors, "test")
    assert all(torch.equal(a, b) for a, b in zip(tensors, before))
