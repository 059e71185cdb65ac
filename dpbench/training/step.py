"""One logical private step, shared by the Lightning module and the plain-loop wrapper so that both form, apply and
account the step the same way."""

from __future__ import annotations

from torch import nn
from torch.optim import Optimizer

from dpbench.privacy.ledger import PrivacyLedger
from dpbench.privatizers.base import PrivatizerStrategy, StepContext, StepOutput
from dpbench.tasks import Batch, Task


def private_step(
    strategy: PrivatizerStrategy, model: nn.Module, task: Task, optimizer: Optimizer, ledger: PrivacyLedger,
    batch: Batch, ctx: StepContext,
) -> StepOutput:
    """The strategy's privatized gradient, its update, and (for a private strategy) the step's mechanisms in the
    ledger."""
    optimizer.zero_grad(set_to_none=True)
    output = strategy.privatize(model, task, batch, ctx)
    strategy.apply_update(optimizer)
    if strategy.is_private:
        ledger.record(strategy.step_mechanisms(ctx.step))
    return output
