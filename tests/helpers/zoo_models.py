"""The per-sample zoo: every torch layer type that carries parameters, the patterns that fool module hooks, and tiny
Hugging Face models, each as a float64 classifier with a batch of 4 samples."""

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dpbench.models.d2p2_cnn import D2P2PaperCNN
from dpbench.models.hf import SequenceClassifier
from tests.helpers import transformer_models
from tests.helpers.checked_models import TrainModeCentering

SAMPLES, CLASSES = 4, 3


@dataclass(frozen=True)
class Entry:
    build: Callable[[], nn.Module]
    batch: Callable[[int], tuple]
    """Seed -> (inputs, targets)."""
    engine: str | None
    """The engine that must give exact per-sample clipping under auto, hooks or functorch; None: must be refused."""


def generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def targets(seed: int) -> Tensor:
    return torch.randint(0, CLASSES, (SAMPLES,), generator=generator(seed + 100))


def dense(*shape: int) -> Callable[[int], tuple]:
    def make(seed: int) -> tuple:
        return torch.randn(SAMPLES, *shape, generator=generator(seed), dtype=torch.float64), targets(seed)

    return make


def tokens(length: int = 5, vocab: int = 10) -> Callable[[int], tuple]:
    def make(seed: int) -> tuple:
        ids = torch.randint(0, vocab, (SAMPLES, length), generator=generator(seed))
        return ids, targets(seed)

    return make


class Classifier(nn.Module):
    """body -> tanh -> flatten -> Linear head: the body's output size is read from one example."""

    def __init__(self, body: nn.Module, example: Tensor):
        super().__init__()
        self.body = body
        with torch.no_grad():
            features = body(example).flatten(1).shape[1]
        self.head = nn.Linear(features, CLASSES)

    def forward(self, x):
        return self.head(torch.tanh(self.body(x)).flatten(1))


def classifier(body: Callable[[], nn.Module], *shape: int, ids: bool = False) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        example = torch.zeros(1, *shape, dtype=torch.long) if ids else torch.zeros(1, *shape)
        return Classifier(body(), example).double()

    return build


def layer(body: Callable[[], nn.Module], *shape: int, engine: str = "hooks") -> Entry:
    return Entry(classifier(body, *shape), dense(*shape), engine)


class Pair(nn.Module):
    """nn.Bilinear on the two halves of the features."""

    def __init__(self):
        super().__init__()
        self.bilinear = nn.Bilinear(3, 3, 4)

    def forward(self, x):
        return self.bilinear(x[:, :3], x[:, 3:])


class SelfAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.attention = nn.MultiheadAttention(6, 2, batch_first=True)

    def forward(self, x):
        return self.attention(x, x, x, need_weights=False)[0]


class Recurrent(nn.Module):
    """Output sequence of a batch-first recurrent layer."""

    def __init__(self, kind: type[nn.RNNBase]):
        super().__init__()
        self.recurrent = kind(3, 4, batch_first=True)

    def forward(self, x):
        return self.recurrent(x)[0]


def batchnorm(mode: str) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        norm = nn.BatchNorm1d(6, track_running_stats=mode == "eval_running_stats")
        model = Classifier(nn.Sequential(nn.Linear(5, 6), norm), torch.zeros(2, 5)).double()
        if mode != "train":
            norm.eval()
        return model

    return build


LAYERS = {
    "linear": layer(lambda: nn.Linear(6, 5), 6),
    "linear_over_tokens": layer(lambda: nn.Linear(6, 5), 4, 6),
    "bilinear": layer(Pair, 6, engine="functorch"),
    "conv1d_stride_padding": layer(lambda: nn.Conv1d(2, 4, 3, stride=2, padding=1), 2, 9),
    "conv1d_dilation": layer(lambda: nn.Conv1d(2, 3, 3, dilation=2), 2, 9),
    "conv1d_groups": layer(lambda: nn.Conv1d(4, 6, 3, groups=2), 4, 7),
    "conv1d_same": layer(lambda: nn.Conv1d(2, 3, 4, padding="same"), 2, 7),
    "conv1d_circular": layer(lambda: nn.Conv1d(2, 3, 3, padding=1, padding_mode="circular"), 2, 7),
    "conv2d_stride_padding": layer(lambda: nn.Conv2d(2, 3, 3, stride=2, padding=1), 2, 6, 6),
    "conv2d_dilation": layer(lambda: nn.Conv2d(2, 3, 3, dilation=2, padding=2), 2, 6, 6),
    "conv2d_groups": layer(lambda: nn.Conv2d(4, 6, 3, groups=2, padding=1), 4, 5, 5),
    "conv2d_depthwise": layer(lambda: nn.Conv2d(4, 4, 3, groups=4, bias=False), 4, 5, 5),
    "conv2d_same": layer(lambda: nn.Conv2d(2, 3, (2, 3), padding="same", dilation=(1, 2)), 2, 6, 6),
    "conv2d_reflect": layer(lambda: nn.Conv2d(2, 3, 3, padding=1, padding_mode="reflect"), 2, 5, 5),
    "conv3d": layer(lambda: nn.Conv3d(2, 3, 2), 2, 3, 4, 4, engine="functorch"),
    "conv_transpose1d": layer(lambda: nn.ConvTranspose1d(2, 3, 3, stride=2), 2, 5, engine="functorch"),
    "conv_transpose2d": layer(lambda: nn.ConvTranspose2d(4, 2, 3, groups=2), 4, 3, 3, engine="functorch"),
    "conv_transpose3d": layer(lambda: nn.ConvTranspose3d(2, 2, 2), 2, 2, 3, 3, engine="functorch"),
    "embedding": Entry(classifier(lambda: nn.Embedding(10, 4, padding_idx=0), 5, ids=True), tokens(), "hooks"),
    "embedding_bag": Entry(classifier(lambda: nn.EmbeddingBag(10, 4, mode="mean"), 5, ids=True), tokens(),
                           "functorch"),
    "layer_norm": layer(lambda: nn.Sequential(nn.Linear(6, 6), nn.LayerNorm(6)), 4, 6),
    "group_norm": layer(lambda: nn.Sequential(nn.Conv2d(2, 4, 3), nn.GroupNorm(2, 4)), 2, 5, 5),
    "instance_norm": layer(lambda: nn.Sequential(nn.Conv2d(2, 3, 3), nn.InstanceNorm2d(3, affine=True)), 2, 5, 5,
                           engine="functorch"),
    "rms_norm": layer(lambda: nn.Sequential(nn.Linear(6, 6), nn.RMSNorm(6)), 4, 6, engine="functorch"),
    "prelu": layer(lambda: nn.Sequential(nn.Linear(6, 5), nn.PReLU(5)), 6, engine="functorch"),
    "multihead_attention": layer(SelfAttention, 4, 6, engine="functorch"),
    "transformer_encoder_layer": layer(
        lambda: nn.TransformerEncoderLayer(6, 2, dim_feedforward=8, dropout=0.0, batch_first=True), 4, 6,
        engine="functorch"),
    "lstm": layer(lambda: Recurrent(nn.LSTM), 5, 3),
    "rnn": layer(lambda: Recurrent(nn.RNN), 5, 3),
    "gru": layer(lambda: Recurrent(nn.GRU), 5, 3),
    "batchnorm_training": Entry(batchnorm("train"), dense(5), None),
    "batchnorm_eval_batch_statistics": Entry(batchnorm("eval_batch_statistics"), dense(5), None),
    "batchnorm_eval_running_stats": Entry(batchnorm("eval_running_stats"), dense(5), None),
}


class InPlace(nn.Module):
    """A hooked layer whose output an in-place op overwrites (what nn.ReLU(inplace=True) does)."""

    def __init__(self, norm: bool):
        super().__init__()
        self.first = nn.Conv2d(2, 4, 3) if norm else nn.Linear(6, 5)
        self.norm = nn.GroupNorm(2, 4) if norm else None
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x):
        h = self.first(x)
        if self.norm is not None:
            h = self.norm(h)
        return self.relu(h)


class InPlaceSlice(nn.Module):
    def __init__(self):
        super().__init__()
        self.first = nn.Linear(6, 5)

    def forward(self, x):
        h = self.first(x)
        h[:, :2].mul_(3.0)
        return h


class ResidualBlock(nn.Module):
    """torchvision's BasicBlock with GroupNorm: in-place ReLUs and an in-place residual add."""

    def __init__(self):
        super().__init__()
        self.conv1, self.norm1 = nn.Conv2d(2, 2, 3, padding=1, bias=False), nn.GroupNorm(1, 2)
        self.conv2, self.norm2 = nn.Conv2d(2, 2, 3, padding=1, bias=False), nn.GroupNorm(1, 2)
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x):
        out = self.relu(self.norm1(self.conv1(x)))
        out = self.norm2(self.conv2(out))
        out += x
        return self.relu(out)


class FunctionalLinear(nn.Module):
    """A Linear's parameters used through F.linear: its module is never called, so no hook fires."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 5)

    def forward(self, x):
        return F.linear(x, self.fc.weight, self.fc.bias)


class TiedHead(nn.Module):
    """An output layer tied to the embedding through F.linear(h, embedding.weight)."""

    def __init__(self):
        super().__init__()
        self.embedding = nn.Embedding(10, 4)
        self.mix = nn.Linear(4, 4)

    def forward(self, ids):
        h = torch.tanh(self.mix(self.embedding(ids).mean(1)))
        return F.linear(h, self.embedding.weight)[:, :CLASSES]


class TimeMajorLSTM(nn.Module):
    """A time-major LSTM's (T, B, H) output flattened with reshape(-1, H) before a per-step head."""

    def __init__(self):
        super().__init__()
        self.embedding = nn.Embedding(10, 3)
        self.lstm = nn.LSTM(3, 4)
        self.step_head = nn.Linear(4, CLASSES)

    def forward(self, ids):
        out, _ = self.lstm(self.embedding(ids).transpose(0, 1))
        steps, batch, hidden = out.shape
        return self.step_head(out.reshape(-1, hidden)).view(steps, batch, -1).mean(0)


class SharedEncoder(nn.Module):
    """Both halves of every sample through one encoder call on torch.cat([a, b]): rows i and B + i are sample i."""

    def __init__(self):
        super().__init__()
        self.encoder = nn.Linear(3, 4)

    def forward(self, x):
        batch = x.shape[0]
        h = self.encoder(torch.cat([x[:, :3], x[:, 3:]]))
        return torch.cat([h[:batch], h[batch:]], 1)


class TimeMajorLinear(nn.Module):
    """A Linear applied to (T, B, D): with T == B the hooks cannot tell time from samples."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 4)

    def forward(self, x):
        return self.fc(x.transpose(0, 1)).mean(0)


class KeywordCall(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 5)

    def forward(self, x):
        return self.fc(input=x)


class Truncated(nn.Linear):
    """A Linear subclass whose forward is not nn.Linear's: a rule looked up by type would be wrong."""

    def forward(self, x):
        return super().forward(x * x)


def opt_with_position_ids(seed: int) -> tuple:
    inputs, labels = transformer_models.text_batch(SAMPLES, seed=seed)
    length = inputs["input_ids"].shape[1]
    inputs["position_ids"] = torch.arange(length).flip(0).expand(SAMPLES, length)  # not the mask's running count
    return inputs, labels


class T5Classifier(nn.Module):
    def __init__(self):
        super().__init__()
        from transformers import T5Config, T5EncoderModel

        config = T5Config(vocab_size=40, d_model=8, d_kv=4, d_ff=12, num_layers=1, num_heads=2, dropout_rate=0.0,
                          pad_token_id=0)
        self.encoder = T5EncoderModel(config)
        self.head = nn.Linear(8, CLASSES)

    def forward(self, inputs):
        return self.head(self.encoder(**inputs).last_hidden_state.mean(1))


def distilbert(explicit_positions: bool) -> nn.Module:
    from transformers import DistilBertConfig, DistilBertForSequenceClassification

    config = DistilBertConfig(vocab_size=40, dim=16, n_layers=1, n_heads=2, hidden_dim=24, max_position_embeddings=12,
                              dropout=0.0, attention_dropout=0.0, seq_classif_dropout=0.0, num_labels=CLASSES,
                              pad_token_id=0)
    return SequenceClassifier(DistilBertForSequenceClassification(config), explicit_positions=explicit_positions)


def hf(build: Callable[[], nn.Module]) -> Callable[[], nn.Module]:
    return lambda: build().double()


def text(seed: int) -> tuple:
    return transformer_models.text_batch(SAMPLES, seed=seed)


def images(seed: int) -> tuple:
    pixels, labels = transformer_models.image_batch(SAMPLES, seed=seed)
    return pixels.double(), labels


PATTERNS = {
    "linear_relu_inplace": layer(lambda: InPlace(norm=False), 6),
    "linear_over_tokens_relu_inplace": layer(lambda: InPlace(norm=False), 4, 6),
    "group_norm_relu_inplace": layer(lambda: InPlace(norm=True), 2, 5, 5),
    "inplace_slice_of_output": layer(InPlaceSlice, 6),
    "residual_block": layer(ResidualBlock, 2, 4, 4),
    "functional_linear": layer(FunctionalLinear, 6, engine="functorch"),
    "tied_embedding_head": Entry(lambda: TiedHead().double(), tokens(), "functorch"),
    "time_major_lstm_flattened": Entry(lambda: TimeMajorLSTM().double(), tokens(), "functorch"),
    "cat_through_shared_encoder": layer(SharedEncoder, 6, engine="functorch"),
    "time_major_linear_t_equals_b": layer(TimeMajorLinear, SAMPLES, 3, engine="functorch"),
    "keyword_call": layer(KeywordCall, 6),
    "train_mode_batch_centering": layer(TrainModeCentering, 6, engine="functorch"),
    "linear_subclass_forward": layer(lambda: Truncated(6, 5), 6, engine="functorch"),
}

TRANSFORMERS = {
    "bert": Entry(hf(transformer_models.bert), text, "hooks"),
    "bert_lora": Entry(hf(transformer_models.bert_lora), text, "hooks"),
    "bert_lora_embeddings": Entry(hf(partial(transformer_models.bert_lora, ("word_embeddings", "query"))), text,
                                  "functorch"),  # peft's lora.Embedding uses its ParameterDicts outside any layer call
    "roberta": Entry(hf(transformer_models.roberta), text, "hooks"),
    "gpt2": Entry(hf(transformer_models.gpt2), text, "hooks"),
    "vit": Entry(hf(transformer_models.vit), images, "hooks"),
    "opt": Entry(hf(transformer_models.opt), text, "hooks"),
    "opt_explicit_position_ids": Entry(hf(transformer_models.opt), opt_with_position_ids, "hooks"),
    "bert_broadcast_position_ids": Entry(hf(partial(transformer_models.bert, False)), text, "functorch"),
    "distilbert": Entry(hf(partial(distilbert, True)), text, "hooks"),
    "distilbert_broadcast_position_ids": Entry(hf(partial(distilbert, False)), text, "functorch"),
    "t5_encoder": Entry(hf(T5Classifier), text, "functorch"),
}

DPBENCH_MODELS = {
    "cnn_d2p2": Entry(lambda: D2P2PaperCNN(2, CLASSES).double(), dense(2, 8, 8), "hooks"),  # 8x8: pools to 1x1
}
"""dpbench's own models that no entry above already covers layer for layer."""

ZOO = {**LAYERS, **PATTERNS, **TRANSFORMERS, **DPBENCH_MODELS}
