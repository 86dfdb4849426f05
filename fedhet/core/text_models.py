"""The `model:` blocks of fedhet's text models, declared as model plug-ins
(fedhet.core.model_config); fedhet.text_models builds them.

    model: {arch: char_lstm}        # LEAF/FedProx's Shakespeare model
    model: {arch: bag_of_words}     # a Sent140 classifier

Both read a sample as token ids (a LEAF text task's, fedhet.data.leaf): `char_lstm` embeds each
of its characters (`embedding` wide, 8 in LEAF), runs `layers` stacked LSTMs of `hidden` units
(2 of 256) and predicts the next character from the last step's output, as LEAF's and FedProx's
`stacked_lstm` do. `bag_of_words` averages an embedding of each word (hashed ids folded into
`buckets` rows; padding left out) and classifies the mean linearly: fastText's classifier (Joulin
et al., "Bag of Tricks for Efficient Text Classification", 2017). FedProx's Sent140 model is an
LSTM over GloVe vectors, which would need GloVe's 400,000-word file; an embedding bag trains from
scratch, on the hashed ids alone, in seconds on a CPU.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from fedhet.core.model_config import ModelConfig


class CharLSTMConfig(ModelConfig):
    builder: ClassVar[str] = "fedhet.text_models:char_lstm"

    arch: Literal["char_lstm"] = "char_lstm"
    vocabulary: int = Field(80, ge=2, le=10**6, description="character ids (LEAF's 80)")
    embedding: int = Field(8, ge=1, le=4096, description="a character's embedding width")
    hidden: int = Field(256, ge=1, le=4096, description="units per LSTM layer")
    layers: int = Field(2, ge=1, le=16, description="stacked LSTM layers")

    def parameter_count(self, in_shape: tuple[int, int, int], num_classes: int) -> int:
        h, widths = self.hidden, [self.embedding] + [self.hidden] * (self.layers - 1)
        lstm = sum(4 * (h * (w + h) + 2 * h) for w in widths)  # torch keeps two biases
        return self.vocabulary * self.embedding + lstm + (h + 1) * num_classes


class BagOfWordsConfig(ModelConfig):
    builder: ClassVar[str] = "fedhet.text_models:bag_of_words"

    arch: Literal["bag_of_words"] = "bag_of_words"
    buckets: int = Field(2**14, ge=1, le=2**24, description="embedding rows words hash into")
    embedding: int = Field(100, ge=1, le=4096, description="a word's embedding width")

    def parameter_count(self, in_shape: tuple[int, int, int], num_classes: int) -> int:
        return (self.buckets + 1) * self.embedding + (self.embedding + 1) * num_classes
