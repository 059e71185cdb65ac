"""A privatizer from outside dpbench on dpbench's per-sample engine: DP-SGD with automatic clipping.

Automatic clipping (Bu et al. 2023) scales sample i's gradient by C / (||g_i|| + gamma) rather than clipping it to
C: every contribution has norm below C, so N(0, (sigma C)^2) on their sum is the default composition's mechanism
(one Poisson-subsampled Gaussian per step). The engine (`make_engine`, the one vanilla and D2P2 use) gives the
weighted sum sum_i f_i g_i for any factors f = factor_fn(norms, C), without writing vmap by hand: from hooks where
the model allows (no per-sample gradient is materialized), else vmap, checked against per-example backward passes.
"""

from dataclasses import dataclass
from functools import partial

from dpbench import PrivatizerStrategy
from dpbench.core.tasks import batch_size_of
from dpbench.privatizers.clipping import automatic_clip_factors, clipping_stats
from dpbench.privatizers.per_sample import make_engine


@dataclass
class AutoClipConfig:
    name: str = "auto_clip"
    gamma: float = 0.01


class AutoClipping(PrivatizerStrategy):
    name = "auto_clip"
    config: AutoClipConfig

    def attach(self, model):
        self.engine = make_engine(model, checks=self.checks)  # the checks run at steps only the strategy knows
        self.sums = {}

    def accumulate(self, model, task, batch, ctx):
        if batch_size_of(batch) == 0:  # an empty Poisson batch is still a step: finalize adds the noise
            return 0.0, {"batch_size": 0.0}
        factors = partial(automatic_clip_factors, gamma=self.config.gamma)
        result = self.engine.clipped_sum(task, batch, self.privacy.clip_norm, factors)
        for name, grad in result.grads.items():
            self.sums[name] = self.sums.get(name, 0) + grad
        return float(result.losses.sum()), clipping_stats(result.norms, self.privacy.clip_norm)

    def finalize(self, model, ctx):
        self.write_noisy_mean(model, self.sums, ctx)
        self.sums = {}
