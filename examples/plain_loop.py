"""dpbench's DP-SGD in a plain PyTorch loop: your model, optimizer and loop; dpbench's Poisson loader, privatizer and
accountant.  Run: python examples/plain_loop.py [steps]"""

import sys

import torch
from torch import nn
from torch.utils.data import TensorDataset

import dpbench


def main(steps: int = 40) -> dpbench.PrivacySpent:
    torch.manual_seed(0)
    x = torch.randn(2000, 20)
    y = (x[:, 0] + x[:, 1] > 0).long()
    model = nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Linear(32, 2))
    loader = dpbench.poisson_loader(TensorDataset(x, y), batch_size=100)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    private = dpbench.make_private(model, optimizer, loader, "vanilla", steps=steps, target_epsilon=3.0)
    while private.steps < steps:
        for batch in loader:
            private.step(batch)
            if private.steps == steps:
                break
    accuracy = (model(x).argmax(1) == y).float().mean()
    spent = private.epsilon()
    print(f"{spent.steps} steps, sigma={private.noise_multiplier:.3f}, epsilon={spent.epsilon:.3f}, "
          f"train accuracy={accuracy:.3f}")
    return spent


if __name__ == "__main__":
    main(*map(int, sys.argv[1:]))
