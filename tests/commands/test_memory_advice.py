"""The micro-batch a memory refusal names must still fit when the run is started again: the free memory a second
process finds differs by a few MB from the first's (CI refused its own advice, 215 samples, at 15,810 MB free)."""

import pytest

from dpbench.app.memory_estimate import MemoryEstimate, check_fits
from dpbench.core.errors import ConfigurationError


def _estimate(micro_batch: int, free_mb: float) -> MemoryEstimate:
    per_sample, activations = 65.2 * micro_batch, 0.56 * micro_batch  # the 0.5M-parameter CNN, materialized
    return MemoryEstimate(weights_mb=65.0, gradients_mb=65.0, optimizer_mb=0.0, per_sample_mb=per_sample,
                          activations_mb=activations, evaluation_mb=0.4 * micro_batch, micro_batch=micro_batch,
                          eval_batch=micro_batch, device="cpu", free_mb=free_mb)


def _advised(error: ConfigurationError) -> int:
    return int(str(error).split("physical_batch_size=")[1].split()[0])


@pytest.mark.parametrize("free_mb", [2_000.0, 15_830.0, 120_000.0])
def test_the_advised_micro_batch_fits_a_rerun_with_slightly_less_free_memory(free_mb):
    with pytest.raises(ConfigurationError, match="physical_batch_size=") as refused:
        check_fits(_estimate(4000, free_mb), batch_size=4000)
    advised = _advised(refused.value)
    assert 1 <= advised < 4000
    check_fits(_estimate(advised, free_mb * 0.99), batch_size=4000)  # 1% less free memory than the first process
    with pytest.raises(ConfigurationError):  # nor is the advice needlessly small
        check_fits(_estimate(int(1.2 * advised) + 1, free_mb), batch_size=4000)
