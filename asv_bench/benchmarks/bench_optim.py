"""asv benchmarks of the optimizer steps: Lion, `DistributedLion` in every compression, and
K-FAC's preconditioning step.

`DistributedLion` runs as rank 0 of two whose partner sends what it sends
(`pysparse_hpc.bench._agreeing_partner.AgreeingPartner`, no MPI): the whole vote path
(packing, the collective's arithmetic, the majority, the update) in one process, where a real
one-rank job takes Lion's step in every mode, having nothing to compress. These time the
compute a compressed step adds, the figure that bounds its projected speed-up on slow links
(``python -m pysparse_hpc.bench lion``, which runs the peers, ``lion-pytorch`` and ASDL among
them). The model is the one of that command: a 64-1024-1024-10 MLP, 1,126,410 parameters,
with a fixed gradient. K-FAC preconditions the 784-256-128-10 MLP of ``python -m
pysparse_hpc.bench precondition`` on a batch of 128, with curvature and inverses every step.
``setup`` takes untimed steps first, so kernels are compiled (or loaded from their cache).
"""
from .bench_kernels import import_torch

#: Untimed steps in ``setup``: kernel compilation, optimizer state.
WARMUP_STEPS = 2

COMPRESSIONS = ["none", "signs", "votes", "int8", "1bit"]


def _mlp(torch, widths):
    torch.manual_seed(0)
    layers = []
    for fan_in, fan_out in zip(widths[:-1], widths[1:]):
        layers += [torch.nn.Linear(fan_in, fan_out), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers[:-1])


class LionStep:
    """One `Lion.step`, or one `DistributedLion.step` as rank 0 of two, on fixed
    gradients."""

    params = [["lion"] + COMPRESSIONS]
    param_names = ["optimizer"]

    def setup(self, optimizer):
        torch = import_torch()
        from pysparse_hpc.bench._agreeing_partner import AgreeingPartner
        from pysparse_hpc.optim import DistributedLion, Lion

        model = _mlp(torch, [64, 1024, 1024, 10])
        generator = torch.Generator().manual_seed(1)
        for param in model.parameters():
            param.grad = torch.randn(param.shape, generator=generator)
        settings = dict(lr=1e-4, weight_decay=0.1)
        if optimizer == "lion":
            self.optimizer = Lion(model.parameters(), **settings)
        else:  # the momentum syncs are full allreduces, timed apart: "local" leaves them out
            self.optimizer = DistributedLion(model.parameters(), comm=AgreeingPartner(),
                                             compression=optimizer, momentum_sync="local",
                                             **settings)
        for _ in range(WARMUP_STEPS):
            self.optimizer.step()

    def time_step(self, optimizer):
        self.optimizer.step()


class KfacStep:
    """One K-FAC step (forward, backward, curvature, inversion, preconditioning) and SGD."""

    params = [["emp"]]
    param_names = ["fisher"]

    def setup(self, fisher):
        torch = import_torch()
        from pysparse_hpc import precondition

        self.F = torch.nn.functional
        self.model = _mlp(torch, [784, 256, 128, 10])
        generator = torch.Generator().manual_seed(0)
        self.x = torch.randn(128, 784, generator=generator)
        self.target = torch.randint(0, 10, (128,), generator=generator)
        config = precondition.PreconditioningConfig(data_size=128, damping=1e-3)
        self.maker = precondition.KfacGradientMaker(self.model, config, fisher_type=fisher)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=1e-3)
        for _ in range(WARMUP_STEPS):
            self.step()

    def step(self):
        self.optimizer.zero_grad()
        placeholder = self.maker.setup_model_call(self.model, self.x)
        self.maker.setup_loss_call(self.F.cross_entropy, placeholder, self.target)
        self.maker.forward_and_backward()
        self.optimizer.step()

    def time_step(self, fisher):
        self.step()
