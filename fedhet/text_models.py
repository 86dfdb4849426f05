"""The networks of fedhet's text models (their spec blocks and the why: fedhet.core.text_models).

Inputs are token ids stored as float32 (N x 1 x 1 x T, fedhet.data.leaf), exact integers; each
network reads them back as integer indices.
"""

from __future__ import annotations

import torch
from torch import nn

from fedhet.core.text_models import BagOfWordsConfig, CharLSTMConfig


class CharLSTM(nn.Module):
    """Embedding, stacked LSTMs, and the last step's output as the features."""

    def __init__(self, config: CharLSTMConfig) -> None:
        super().__init__()
        self.embedding = nn.Embedding(config.vocabulary, config.embedding)
        self.lstm = _Outputs(config.embedding, config.hidden, config.layers, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ids = x.reshape(len(x), -1).long()
        return self.lstm(self.embedding(ids))[:, -1]


class _Outputs(nn.LSTM):
    """An LSTM that returns its outputs alone (not the final states): every parameterized module
    of a fedhet model returns one tensor, which TCT's per-module eNTK needs."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return super().forward(x)[0]


class WordBag(nn.Module):
    """The mean of the words' embeddings; id 0 pads, other ids fold into `buckets` rows."""

    def __init__(self, config: BagOfWordsConfig) -> None:
        super().__init__()
        self.buckets = config.buckets
        self.embedding = nn.EmbeddingBag(
            config.buckets + 1, config.embedding, mode="mean", padding_idx=0
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ids = x.reshape(len(x), -1).long()
        return self.embedding(torch.where(ids > 0, 1 + (ids - 1) % self.buckets, 0))


def char_lstm(
    config: CharLSTMConfig, in_shape: tuple[int, int, int], num_classes: int
) -> tuple[nn.Module, nn.Linear]:
    return CharLSTM(config), nn.Linear(config.hidden, num_classes)


def bag_of_words(
    config: BagOfWordsConfig, in_shape: tuple[int, int, int], num_classes: int
) -> tuple[nn.Module, nn.Linear]:
    return WordBag(config), nn.Linear(config.embedding, num_classes)
