"""Hugging Face text models given attention masks with padding, under the functorch engine, in float64: exact against a
per-example loop (BERT, RoBERTa, DistilBERT, GPT-2, OPT, a T5 encoder with a head, T5ForSequenceClassification)."""

import pytest
import torch
from torch import nn
from transformers import DistilBertConfig, DistilBertForSequenceClassification, T5Config, T5EncoderModel
from transformers import T5ForSequenceClassification as T5Classifier
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

from dpbench.models.hf import SequenceClassifier
from tests.helpers.per_sample_reference import check_exact
from tests.helpers.transformer_models import bert, gpt2, opt, roberta

EOS = 1


def distilbert():
    config = DistilBertConfig(vocab_size=40, dim=16, n_layers=1, n_heads=2, hidden_dim=24, max_position_embeddings=12,
                              dropout=0.0, attention_dropout=0.0, seq_classif_dropout=0.0, num_labels=3, pad_token_id=0)
    return SequenceClassifier(DistilBertForSequenceClassification(config), explicit_positions=False)


T5 = {"vocab_size": 40, "d_model": 16, "d_kv": 8, "d_ff": 24, "num_layers": 1, "num_heads": 2, "dropout_rate": 0.0,
      "relative_attention_num_buckets": 8, "pad_token_id": 0, "eos_token_id": EOS, "decoder_start_token_id": 0,
      "num_labels": 3}


class T5EncoderHead(nn.Module):
    """T5's encoder, mean-pooled over the unpadded tokens, and a linear head."""

    def __init__(self):
        super().__init__()
        self.encoder = T5EncoderModel(T5Config(**T5))
        self.head = nn.Linear(16, 3)

    def forward(self, inputs):
        hidden = self.encoder(**inputs).last_hidden_state
        mask = inputs["attention_mask"].unsqueeze(-1).to(hidden.dtype)
        return self.head((hidden * mask).sum(1) / mask.sum(1))


def t5_classifier():
    """Selects each sample's <eos> state by a boolean mask: a data-dependent shape that vmap cannot batch."""
    return SequenceClassifier(T5Classifier(T5Config(**T5, num_decoder_layers=1)), explicit_positions=False)


MODELS = {"bert": bert, "roberta": roberta, "distilbert": distilbert, "gpt2": gpt2, "opt": opt,
          "t5_encoder": T5EncoderHead, "t5_classifier": t5_classifier}


def padded_batch(seed: int, size: int = 5, length: int = 7):
    """Right and left padding, one unpadded sample, exactly one <eos> per sample (T5's classifier needs it)."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(2, 40, (size, length), generator=generator)
    mask = torch.ones(size, length, dtype=torch.long)
    mask[0, -3:] = 0
    mask[2, -1:] = 0
    mask[3, :2] = 0
    ids[torch.arange(size), length - 1 - mask.flip(1).argmax(1)] = EOS  # the last unpadded token
    return {"input_ids": ids * mask, "attention_mask": mask}, torch.randint(0, 3, (size,), generator=generator)


@pytest.mark.parametrize("case", sorted(MODELS))
def test_text_transformers_with_padding_match_a_per_example_loop(case):
    torch.manual_seed(0)
    model = MODELS[case]().double()
    check_exact(model, padded_batch(1), padded_batch(2), looped=case == "t5_classifier")  # the others run under vmap
    assert ALL_MASK_ATTENTION_FUNCTIONS["sdpa"] is sdpa_mask  # restored
