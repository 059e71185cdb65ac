"""The LSTM pieces: exact per-sample nn.LSTM gradients in the hook engine (against a per-example loop), the refusals
the recompute needs, and the offline Rotten Tomatoes data with its word vocabulary."""

import pytest
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf
from torch import nn

from dpbench.core.errors import UnsupportedModelError
from dpbench.core.tasks import ClassificationTask
from dpbench.data import load_data
from dpbench.data.text import PAD, UNK, WordVocabulary, load_texts
from dpbench.models import build_model
from dpbench.models.lstm import LSTMClassifier, LSTMConfig
from dpbench.privatizers.per_sample import HookEngine, make_engine

pytestmark = pytest.mark.models_as_built

TASK = ClassificationTask()


class SequenceLSTM(nn.Module):
    """Uses the whole output sequence and the final cell state, time-major: every gradient path of nn.LSTM."""

    def __init__(self, layers: int, bidirectional: bool):
        super().__init__()
        self.embedding = nn.Embedding(9, 4)
        self.lstm = nn.LSTM(4, 3, num_layers=layers, bidirectional=bidirectional)
        width = 3 * (2 if bidirectional else 1)
        self.head = nn.Linear(width + 3, 2)

    def forward(self, ids):
        out, (_, cell) = self.lstm(self.embedding(ids).transpose(0, 1))
        return self.head(torch.cat([torch.tanh(out).mean(0), cell[-1]], dim=1))


def loop_gradients(model, ids, targets):
    grads = []
    for i in range(targets.shape[0]):
        model.zero_grad()
        F.cross_entropy(model(ids[i : i + 1]), targets[i : i + 1]).backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    return grads


MODELS = {
    "paper_bilstm": lambda: LSTMClassifier(9, 2, LSTMConfig(embedding_dim=4, hidden_size=3, dense_size=5)),
    "two_layer_bilstm_time_major": lambda: SequenceLSTM(2, True),
    "two_layer_lstm_time_major": lambda: SequenceLSTM(2, False),
}


@pytest.mark.parametrize("case", sorted(MODELS))
@pytest.mark.parametrize("engine_name", ["auto", "materialized"])
def test_lstm_per_sample_gradients_and_clipped_sum_match_loop(case, engine_name):
    torch.manual_seed(0)
    model = MODELS[case]()
    generator = torch.Generator().manual_seed(1)
    ids, targets = torch.randint(0, 9, (5, 6), generator=generator), torch.randint(0, 2, (5,), generator=generator)
    ids[0, :3] = PAD  # padding, as the data pads
    engine = make_engine(model, engine_name)
    if engine_name == "auto":
        assert isinstance(engine.engine, HookEngine)  # the exact fast route, not vmap
    reference = loop_gradients(model, ids, targets)
    per_sample = engine.per_sample_gradients(TASK, (ids, targets))
    for i, expected in enumerate(reference):
        for name, grad in expected.items():
            torch.testing.assert_close(per_sample[name][i], grad, atol=1e-5, rtol=1e-4)
    norms = torch.stack([sum(g.pow(2).sum() for g in r.values()).sqrt() for r in reference])
    clip = float(norms.median())
    result = engine.clipped_sum(TASK, (ids, targets), clip)
    torch.testing.assert_close(result.norms, norms, atol=1e-5, rtol=1e-4)
    for name in reference[0]:
        expected = sum(min(1.0, clip / (float(n) + 1e-6)) * r[name] for n, r in zip(norms, reference, strict=True))
        torch.testing.assert_close(result.grads[name], expected, atol=1e-5, rtol=1e-4)


class LastStep(nn.Module):
    def __init__(self, lstm: nn.LSTM, initial_state: bool = False):
        super().__init__()
        self.lstm = lstm
        self.initial_state = initial_state

    def forward(self, x):
        if self.initial_state:
            state = torch.ones(self.lstm.num_layers, x.shape[0], self.lstm.hidden_size)
            return self.lstm(x, (state, state))[0][:, -1]
        return self.lstm(x)[0][:, -1]


def test_what_the_recompute_cannot_reproduce_is_refused():
    batch = (torch.randn(2, 4, 3), torch.tensor([0, 1]))
    with pytest.raises(UnsupportedModelError, match="initial state"):
        HookEngine(LastStep(nn.LSTM(3, 2, batch_first=True), initial_state=True)).per_sample_gradients(TASK, batch)
    with pytest.raises(UnsupportedModelError, match="dropout"):
        HookEngine(LastStep(nn.LSTM(3, 2, num_layers=2, dropout=0.5, batch_first=True))).per_sample_gradients(
            TASK, batch)


def test_rotten_tomatoes_split_and_word_vocabulary():
    raw = load_texts("rotten_tomatoes")
    assert len(raw.train_texts) + len(raw.test_texts) == 12_808 and len(raw.test_texts) == 2000
    assert set(raw.train_labels) == {0, 1} and 0.5 < sum(raw.train_labels) / len(raw.train_labels) < 0.65
    assert load_texts("rotten_tomatoes").test_texts == raw.test_texts  # a fixed split
    data = load_data(OmegaConf.create({"name": "rotten_tomatoes", "vocab_size": 500, "max_length": 12}))
    assert data.train.features.shape == (10_808, 12) and data.vocab_size == 500
    assert int(data.train.features.max()) < 500 and data.num_classes == 2
    first = data.train.features[0].tolist()
    assert first[0] == PAD or all(t != PAD for t in first)  # pre-padding: pads only at the front
    model = build_model(OmegaConf.create({"name": "lstm"}), data)
    assert model.embedding.num_embeddings == 500


def test_vocabulary_is_built_from_training_counts_and_pads_and_truncates():
    vocabulary = WordVocabulary(["b a a c", "a b d"], size=4)  # pad, unk, then 'a' (3), 'b' (2)
    assert vocabulary.ids == {"a": 2, "b": 3}
    assert vocabulary.encode(["c a b a b"], 3, "pre").tolist() == [[3, 2, 3]]  # keeps the end
    assert vocabulary.encode(["c a"], 4, "pre").tolist() == [[PAD, PAD, UNK, 2]]
    assert vocabulary.encode(["c a b a"], 3, "post").tolist() == [[UNK, 2, 3]]


def test_paper_lstm_size():
    """8,000 x 64 embedding, BiLSTM 64 (PyTorch keeps two bias vectors), dense 64, 2 outputs."""
    model = LSTMClassifier(8000, 2, LSTMConfig())
    expected = 8000 * 64 + 2 * 4 * 64 * (64 + 64 + 2) + (128 * 64 + 64) + (64 * 2 + 2)
    assert sum(p.numel() for p in model.parameters()) == expected
