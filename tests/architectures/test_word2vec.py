"""Word2vec: the negative-sampling loss by hand, sparse per-sample gradients against vmap(grad), the corpus."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf

from dpbench.core.tasks import NegativeSamplingTask
from dpbench.data.corpus import build_vocabulary, insert_canaries, make_canaries, windows
from dpbench.models.word2vec import Word2Vec, Word2VecConfig
from dpbench.privatizers import PrivacySettings, make_strategy
from dpbench.privatizers.per_sample import FunctorchEngine, HookEngine
from tests.helpers.models import w2v_batch

pytestmark = pytest.mark.models_as_built

TASK = NegativeSamplingTask()


def test_cbow_loss_by_hand():
    torch.manual_seed(0)
    model = Word2Vec(30, 5, mode="cbow")
    inputs, targets = w2v_batch(30, 3)
    losses = TASK.per_sample_loss(model, (inputs, targets))
    e = model.embedding.weight.detach()
    for i in range(3):
        hidden = e[inputs["context"][i]].mean(0)
        expected = -F.logsigmoid(e[inputs["center"][i]] @ hidden)
        expected = expected - sum(F.logsigmoid(-(e[n] @ hidden)) for n in inputs["negatives"][i])
        torch.testing.assert_close(losses[i], expected)


def test_skipgram_loss_by_hand_untied():
    torch.manual_seed(0)
    model = Word2Vec(30, 5, mode="skipgram", tied=False)
    inputs, targets = w2v_batch(30, 2)
    losses = TASK.per_sample_loss(model, (inputs, targets))
    e_in, e_out = model.embedding.weight.detach(), model.output.weight.detach()
    for i in range(2):
        hidden = e_in[inputs["center"][i]]
        positive = torch.stack([F.logsigmoid(e_out[c] @ hidden) for c in inputs["context"][i]]).mean()
        negative = sum(F.logsigmoid(-(e_out[n] @ hidden)) for n in inputs["negatives"][i])
        torch.testing.assert_close(losses[i], -positive - negative)


def _fitted_loss(tied: bool, negatives: int = 4) -> float:
    """Full-batch Adam on a corpus whose centre word is the first context word, negatives never the centre."""
    torch.manual_seed(0)
    vocab, size = 20, 400
    generator = torch.Generator().manual_seed(1)
    context = torch.randint(vocab, (size, 4), generator=generator)
    offsets = torch.randint(1, vocab, (size, negatives), generator=generator)
    inputs = {"center": context[:, 0].clone(), "context": context, "negatives": (context[:, :1] + offsets) % vocab}
    model = Word2Vec(vocab, 8, tied=tied)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
    for _ in range(300):
        loss = TASK.per_sample_loss(model, (inputs, inputs["center"])).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return loss.item()


def test_the_default_untied_model_learns_where_a_tied_table_cannot():
    """A tied table's scores E E^T are positive semi-definite: the negatives' term stays near K log 2, whatever it
    learns (the BBC runs sat at 9 log 2 = 6.24, even nonprivate). Separate tables fit the same corpus."""
    floor = 4 * math.log(2)
    assert _fitted_loss(tied=True) > 0.9 * floor
    assert _fitted_loss(tied=Word2VecConfig().tied) < 0.5 * floor


@pytest.mark.parametrize("mode,tied", [("cbow", True), ("skipgram", True), ("cbow", False)])
def test_sparse_per_sample_gradients_equal_dense(mode, tied):
    """The sparse strategy's clipped sum (touched rows only) equals vmap(grad)'s dense clipped sum."""
    torch.manual_seed(0)
    vocab, batch = 40, 7
    model = Word2Vec(vocab, 6, mode=mode, tied=tied)
    inputs, targets = w2v_batch(vocab, batch, window=4, negatives=3)
    inputs["context"][0, :2] = inputs["center"][0]  # repeated ids within a sample
    clip = 0.05  # small enough that every sample is clipped
    dense = FunctorchEngine(model).clipped_sum(TASK, (inputs, targets), clip)
    assert (dense.norms > clip).all()
    per_sample = FunctorchEngine(model).per_sample_gradients(TASK, (inputs, targets))
    hooks = HookEngine(model).per_sample_gradients(TASK, (inputs, targets))
    for name, grad in per_sample.items():
        torch.testing.assert_close(hooks[name], grad, atol=1e-6, rtol=1e-5)
    strategy = make_strategy(OmegaConf.create({"name": "sparse"}), PrivacySettings(clip, 0.1, 1.0))
    strategy.attach(model)
    strategy.accumulate(model, TASK, (inputs, targets), None)
    touched, average = strategy._touched(expected_batch_size=1.0)
    flat = torch.zeros(strategy.num_coordinates, dtype=torch.float64)
    flat[torch.as_tensor(touched)] = average
    expected = torch.cat([dense.grads[name].reshape(-1) for name in strategy._names]).double()
    torch.testing.assert_close(flat, expected, atol=1e-7, rtol=1e-5)
    rows = torch.cat([inputs["center"].unsqueeze(1), inputs["context"], inputs["negatives"]], 1).unique()
    assert len(touched) <= len(rows) * 6 * (1 if tied else 2)  # only the batch's rows, never the vocabulary


def test_vocabulary_drops_stop_words_and_keeps_the_most_frequent():
    docs = [["the", "cat", "sat", "on", "the", "mat", "cat", "dog", "dog", "dog", "a"]]
    assert build_vocabulary(docs, 2) == ["dog", "cat"]
    assert build_vocabulary(docs, 4) == ["dog", "cat", "mat", "sat"]


def test_windows_take_half_the_context_on_each_side():
    centres, contexts = windows([np.arange(10, 17)], window=4)
    assert centres.tolist() == [12, 13, 14]
    assert contexts.tolist() == [[10, 11, 13, 14], [11, 12, 14, 15], [12, 13, 15, 16]]


def test_canaries_appear_contiguously_the_requested_number_of_times():
    docs = [np.full(50, 999, dtype=np.int64) for _ in range(4)]
    canaries = make_canaries(20, 5, seed=3)
    inserted = insert_canaries(docs, canaries, copies=3, seed=3)
    text = " " + " ".join(" ".join(map(str, d)) for d in inserted) + " "
    for phrase in canaries.tolist():
        assert text.count(" " + " ".join(map(str, phrase)) + " ") >= 3
    assert sum(len(d) for d in inserted) == 200 + 5 * 3 * 3


def test_brown_files_are_read_without_their_tags(tmp_path):
    from dpbench.core.errors import MissingDataError
    from dpbench.data.corpus import brown_documents

    (tmp_path / "ca01").write_text("The/at Fulton/np-tl County/nn-tl said/vbd ./.\n")
    (tmp_path / "README").write_text("not a corpus file")
    assert brown_documents(str(tmp_path)) == ["The Fulton County said ."]
    with pytest.raises(MissingDataError, match="Brown corpus was not found"):
        brown_documents(str(tmp_path / "missing"))
