"""asv benchmarks of one training step of our GCN and GAT on the bundled Cora, and of GCN's
normalization of a larger graph.

A step is what ``python -m pysparse_hpc.bench gnn`` times per epoch: forward, cross-entropy on
the training nodes, backward and an Adam step, with the models' defaults. PyTorch Geometric,
the peer of that command, is left out here so the suite needs no extra dependency. For GAT the
hidden width is that of the first layer, 8 heads of ``hidden / 8``. When torch is missing,
``setup`` raises NotImplementedError and asv skips the benchmark.
"""
from .bench_kernels import import_torch

#: Untimed steps in ``setup``: kernel compilation, caches, Adam's state.
WARMUP_STEPS = 2

GAT_HEADS = 8


class TrainingStep:
    """One full-batch training step of our model on Cora."""

    params = [["gcn", "gat"], [16, 64]]
    param_names = ["model", "hidden"]

    def setup(self, model, hidden):
        torch = import_torch()
        from pysparse_hpc import datasets
        from pysparse_hpc.nn.models import MODELS
        from pysparse_hpc.nn.train import node_tensors

        self.F = torch.nn.functional
        cora = datasets.load("cora")
        self.adj = cora.adj
        self.x, self.y, self.train_mask, _, _ = node_tensors(cora)
        cls = MODELS[model]
        widths = (dict(hidden=hidden // GAT_HEADS, heads=GAT_HEADS) if model == "gat"
                  else dict(hidden=hidden))
        torch.manual_seed(0)
        self.model = cls(self.x.shape[1], out_channels=cora.num_classes, **widths)
        self.optimizer = torch.optim.Adam(
            self.model.param_groups(cls.training["weight_decay"]), lr=cls.training["lr"])
        self.model.train()
        for _ in range(WARMUP_STEPS):
            self.step()

    def step(self):
        self.optimizer.zero_grad()
        logits = self.model(self.x, self.adj)
        loss = self.F.cross_entropy(logits[self.train_mask], self.y[self.train_mask])
        loss.backward()
        self.optimizer.step()

    def time_training_step(self, model, hidden):
        self.step()


class Normalization:
    """`gcn_norm` of a graph without self-loops (every loop is added): its time and the
    process's peak memory (``python -m pysparse_hpc.bench norm`` compares both with PyG's)."""

    def setup(self):
        import numpy as np

        import pysparse_hpc as sph
        from pysparse_hpc.nn import gcn_norm

        self.gcn_norm = gcn_norm
        rng = np.random.default_rng(0)
        nodes, edges = 200_000, 2_000_000
        rows, cols = rng.integers(0, nodes, edges), rng.integers(0, nodes, edges)
        apart = rows != cols
        self.adj = sph.csr_array((np.ones(int(apart.sum()), np.float32),
                                  (rows[apart], cols[apart])), shape=(nodes, nodes),
                                 index_dtype=np.int32)
        self.gcn_norm(self.adj)   # kernels compiled or loaded

    def time_gcn_norm(self):
        self.gcn_norm(self.adj)

    def peakmem_gcn_norm(self):
        self.gcn_norm(self.adj)
