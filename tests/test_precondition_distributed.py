"""The one-process side of distributed preconditioning: a one-rank communicator changes
nothing, bad arguments, KAISA's greedy owners and the flat-buffer sums (the multi-rank runs are
in tests/mpi/checks.py::check_precondition), and a half-precision reduction under a real
``mpiexec -n 2`` and ``-n 3``."""
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402

from pysparse_hpc import precondition as P  # noqa: E402
from pysparse_hpc.distributed import Communicator  # noqa: E402
from pysparse_hpc.distributed._comm import mpiexec_path  # noqa: E402
from pysparse_hpc.precondition._kaisa import allreduce_sum, assign_owners  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parent.parent

requires_mpi = pytest.mark.skipif(
    importlib.util.find_spec("mpi4py") is None or mpiexec_path() is None,
    reason="needs mpi4py and mpiexec (pip install mpi4py mpich, or the [mpi] extra)")


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


# Run under mpiexec: a module that rank 0's forward alone reaches (a data-dependent branch) in a
# half-precision model. Every rank must send its curvature in the same dtype (float32), the
# ranks without it zeros, and all end with the one-process curvature of rank 0's examples.
_HALF_PRECISION_REDUCE = r"""
import copy
import warnings

import torch
import torch.nn.functional as F
from torch import nn

from pysparse_hpc import distributed
from pysparse_hpc import precondition as P

comm = distributed.init()


class Branch(nn.Module):
    def __init__(self):
        super().__init__()
        self.first, self.aux, self.out = nn.Linear(4, 6), nn.Linear(6, 6), nn.Linear(6, 3)

    def forward(self, x, use_aux):
        h = torch.tanh(self.first(x))
        if use_aux:
            h = h + torch.tanh(self.aux(h))
        return self.out(h)


# The curvature (not the inverses) of module aux after one step on 8 examples a rank.
def curvature(maker, model, x, t, use_aux, communicator=None):
    config = P.PreconditioningConfig(data_size=8 * comm.size, damping=1e-2)
    gm = maker(model, config, fisher_type="emp", comm=communicator)
    gm.setup_loss_call(F.cross_entropy, gm.setup_model_call(model, x, use_aux).float(), t)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        gm.forward_and_backward()
    return {key: value for key, value in gm.factors("aux").items()
            if not key.endswith(("_inv", "_chol"))}


for dtype in (torch.bfloat16, torch.float16):
    for maker in (P.KfacGradientMaker, P.DiagNaturalGradientMaker):
        torch.manual_seed(0)
        model = Branch().to(dtype)
        alone = copy.deepcopy(model)
        generator = torch.Generator().manual_seed(comm.rank)
        x = torch.randn(8, 4, generator=generator).to(dtype)
        t = torch.randint(0, 3, (8,), generator=generator)
        got = curvature(maker, model, x, t, comm.rank == 0, comm)
        generator = torch.Generator().manual_seed(0)
        x = torch.randn(8, 4, generator=generator).to(dtype)
        t = torch.randint(0, 3, (8,), generator=generator)
        expected = curvature(maker, alone, x, t, True)
        assert sorted(got) == sorted(expected), (sorted(got), sorted(expected))
        for key, value in got.items():
            assert value.dtype == torch.float32, (maker.__name__, dtype, key, value.dtype)
            assert torch.equal(value, expected[key]), (maker.__name__, dtype, key)
print(f"PASSED half_precision_reduce rank {comm.rank}", flush=True)
"""


@pytest.mark.mpi
@requires_mpi
@pytest.mark.parametrize("ranks", [2, 3])
def test_a_half_precision_module_complete_on_some_ranks_only_is_reduced(ranks):
    """bfloat16 and float16 models (K-FAC and the diagonal Fisher) with a module that rank
    0's forward alone reaches: the ranks without its curvature add float32 zeros, as wide as
    rank 0's float32 curvature (they sent zeros in the weight's dtype, and the allreduce of
    buffers of different sizes aborted the job), and every rank ends with the one-process
    curvature of rank 0's examples."""
    env = dict(os.environ, PYSPARSE_HPC_NUM_THREADS="1", OMP_NUM_THREADS="1",
               PYTHONUNBUFFERED="1")
    timeout = 120
    try:
        done = subprocess.run([mpiexec_path(), "-n", str(ranks), sys.executable, "-c",
                               _HALF_PRECISION_REDUCE], cwd=REPO_ROOT, env=env,
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"mpiexec -n {ranks} hung for {timeout} s:\n{exc.stdout}\n{exc.stderr}")
    assert done.returncode == 0, f"exit status {done.returncode}\n{done.stdout}\n" \
                                 f"{done.stderr[-6000:]}"
    for rank in range(ranks):
        assert f"PASSED half_precision_reduce rank {rank}" in done.stdout, done.stdout
