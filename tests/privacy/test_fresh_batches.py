"""Issue 14, finding 1: every logical step trains on a fresh Poisson draw, across epochs, resumes and sampling modes,
checked through a real Lightning Trainer over several epochs (and the CLI), never by calling the sampler by hand."""

import csv

import pytest
import torch
from scipy import stats

from dpbench.privacy.randomness import PrivacyRandomness
from dpbench.privacy.sampling import PoissonBatchSampler
from tests.helpers.cli import FAST, dpbench, final_weights
from tests.helpers.trainer_run import fit, index_data

pytestmark = pytest.mark.models_as_built

N, BATCH, EPOCHS = 400, 20, 10  # q = 0.05: 20 steps an epoch
FALSE_ALARM = 1e-3


def epochs_of(batches: list[list[int]], steps_per_epoch: int) -> list[list[list[int]]]:
    return [batches[start : start + steps_per_epoch] for start in range(0, len(batches), steps_per_epoch)]


def test_every_epoch_draws_fresh_poisson_batches_with_binomial_inclusion_counts():
    steps_per_epoch = N // BATCH
    recorder, module = fit(index_data(N), BATCH, EPOCHS * steps_per_epoch, PrivacyRandomness(2))
    batches = recorder.batches
    assert len(batches) == module.ledger.steps == EPOCHS * steps_per_epoch
    epochs = epochs_of(batches, steps_per_epoch)
    assert all(epochs[i] != epochs[j] for i in range(EPOCHS) for j in range(i))
    # each sample's inclusion count over T steps is Binomial(T, q): a dispersion test at a fixed false-alarm rate
    # (replayed epochs make the counts EPOCHS times a Binomial(T / EPOCHS, q), EPOCHS times more dispersed)
    steps, q = len(batches), BATCH / N
    counts = torch.zeros(N, dtype=torch.float64)
    for batch in batches:
        counts[batch] += 1
    dispersion = float(((counts - steps * q) ** 2).sum() / (steps * q * (1 - q)))
    low, high = stats.chi2.ppf([FALSE_ALARM / 2, 1 - FALSE_ALARM / 2], N)
    assert low < dispersion < high
    # and a sample's presence in a step says nothing about the same position one epoch later
    same_position = [len(set(a) & set(b)) for a, b in zip(batches, batches[steps_per_epoch:], strict=False)]
    expected = sum(len(a) for a in batches[steps_per_epoch:]) * q
    assert abs(sum(same_position) - expected) < 4 * expected**0.5


def test_a_resumed_run_continues_the_batches_of_an_uninterrupted_one(tmp_path):
    data, checkpoint = index_data(N), tmp_path / "half.ckpt"
    uninterrupted, _ = fit(data, BATCH, 60, PrivacyRandomness(11))
    first, _ = fit(data, BATCH, 30, PrivacyRandomness(11), checkpoint_out=checkpoint)
    second, module = fit(data, BATCH, 60, PrivacyRandomness(11), checkpoint_in=checkpoint)
    assert module.ledger.steps == 60
    assert first.batches + second.batches == uninterrupted.batches
    assert second.batches != first.batches  # not a replay of the run's start


def test_a_resumed_run_with_a_secret_seed_continues_the_checkpoints_stream(tmp_path):
    data, checkpoint = index_data(N), tmp_path / "half.ckpt"
    first, module = fit(data, BATCH, 25, PrivacyRandomness(), checkpoint_out=checkpoint)
    root = module.strategy.privacy.randomness.root
    resumed, _ = fit(data, BATCH, 50, PrivacyRandomness(), checkpoint_in=checkpoint)
    sampler = PoissonBatchSampler(N, BATCH / N, PrivacyRandomness(root))
    assert resumed.batches == [sampler.batch(step) for step in range(25, 50)]
    assert first.batches == [sampler.batch(step) for step in range(25)]


def test_shuffled_sampling_draws_a_fresh_permutation_each_epoch():
    recorder, _ = fit(index_data(N), BATCH, 3 * (N // BATCH), PrivacyRandomness(), sampling="shuffle")
    epochs = epochs_of(recorder.batches, N // BATCH)
    assert all(sorted(i for b in epoch for i in b) == list(range(N)) for epoch in epochs)
    assert epochs[0] != epochs[1] != epochs[2] != epochs[0]


def logged_batch_sizes(run_dir) -> list[float]:
    with (run_dir / "csv" / "metrics.csv").open() as handle:
        return [float(row["train/batch_size"]) for row in csv.DictReader(handle) if row.get("train/batch_size")]


@pytest.fixture(scope="module")
def three_epoch_runs(tmp_path_factory):
    """Three CLI runs of 3 epochs: two with a secret seed, one with an explicit one (and one more with it)."""
    args = ["epochs=3", "+data.train_size=1000", "batch_size=125", "trainer.log_every_n_steps=1",
            "logger.train_stats=true",
            "trainer.check_val_every_n_epoch=null", *FAST]
    dirs = {}
    for name, extra in [("secret_a", []), ("secret_b", []), ("explicit_a", ["privacy.seed=8675309424242"]),
                        ("explicit_b", ["privacy.seed=8675309424242"])]:
        dirs[name] = tmp_path_factory.mktemp(name)
        run = dpbench(*args, *extra, f"hydra.run.dir={dirs[name]}")
        assert run.returncode == 0, run.stderr[-3000:]
    return dirs


def test_cli_epochs_train_on_different_batches(three_epoch_runs):
    sizes = logged_batch_sizes(three_epoch_runs["secret_a"])
    assert len(sizes) == 24
    assert sizes[:8] != sizes[8:16] and sizes[8:16] != sizes[16:] and sizes[:8] != sizes[16:]


def test_cli_privacy_seed_null_is_fresh_and_an_explicit_one_reproduces_the_run(three_epoch_runs):
    a, b = three_epoch_runs["secret_a"], three_epoch_runs["secret_b"]
    assert logged_batch_sizes(a) != logged_batch_sizes(b)
    assert not torch.equal(final_weights(a), final_weights(b))
    a, b = three_epoch_runs["explicit_a"], three_epoch_runs["explicit_b"]
    assert logged_batch_sizes(a) == logged_batch_sizes(b)
    assert torch.equal(final_weights(a), final_weights(b))


def test_cli_never_writes_an_explicit_privacy_seed(three_epoch_runs):
    run_dir = three_epoch_runs["explicit_a"]
    written = [path for path in run_dir.rglob("*") if path.is_file() and path.suffix != ".ckpt"]
    assert {"results.json", "config.yaml", "overrides.yaml", "hydra.yaml"} <= {path.name for path in written}
    assert not [path for path in written if "8675309424242" in path.read_text(errors="ignore")]
