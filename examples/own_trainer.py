"""dpbench's DP-SGD under your own Lightning Trainer: dpbench's module and Poisson data module, your Trainer.
Run: python examples/own_trainer.py [steps]"""

import sys

import lightning as L
import torch
from torch import nn

import dpbench


def main(steps: int = 40) -> dpbench.EpsilonReport:
    torch.manual_seed(0)
    x = torch.randn(2500, 20)
    y = (x[:, 0] + x[:, 1] > 0).long()
    data = dpbench.DataBundle("toy", dpbench.TensorSplit(x[:2000], y[:2000]), dpbench.TensorSplit(x[2000:], y[2000:]),
                              num_classes=2)
    model = nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Linear(32, 2))
    module, datamodule = dpbench.make_private_module(
        model, data, "vanilla", optimizer=dpbench.OptimizerConfig(lr=0.5), batch_size=100, steps=steps,
        target_epsilon=3.0,
    )
    trainer = L.Trainer(max_steps=steps, accelerator="cpu", logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, use_distributed_sampler=False)
    trainer.fit(module, datamodule=datamodule)
    tested = trainer.test(module, datamodule=datamodule, verbose=False)[0]
    spent = module.epsilon()
    print(f"{module.ledger.steps} steps, epsilon={spent.epsilon:.3f}, test accuracy={tested['test/accuracy']:.3f}")
    return spent


if __name__ == "__main__":
    main(*map(int, sys.argv[1:]))
