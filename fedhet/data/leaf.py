"""The `leaf` dataset: a folder of LEAF's JSON files (Caldas et al., "LEAF: A Benchmark for
Federated Settings", 2018), one client per user.

    data: {dataset: leaf, path: leaf/femnist, task: femnist}
    partition: {scheme: natural}          # one client per user of train/
    eval: {client_test: {}}               # each client scored on its own users' test samples

fedhet.data.leaf_files reads and checks the folder and hashes its bytes (the key's identity: a
changed byte recomputes, a moved folder does not). Per task, a sample becomes:

- femnist: 784 pixel values, a 28 x 28 grey image used as given (LEAF's values in [0, 1]); 62
  classes (digits, upper- and lower-case letters).
- shakespeare: an 80-character window as 80 character ids, the label the next character's id,
  both over LEAF's 80-character vocabulary (`VOCABULARY`, LEAF's `ALL_LETTERS`): 80 classes.
- sent140: the tweet's text (`x[4]` of LEAF's raw fields, or `x` itself when a string), split
  into words by LEAF's `split_line`, lower-cased, its first 25 words (LEAF's `max_words`) as
  hashed word ids (1 + crc32(word) mod 2^24 - 1; 0 pads), 2 classes. Hashing needs no
  vocabulary file (LEAF's model reads GloVe's): the `bag_of_words` model folds the ids into its
  own buckets.

Users: those of train/, sorted by name, are the clients 0..K-1; `min_samples` keeps the users
with at least that many samples (train and test together, LEAF's `-k`) and `user_fraction` a
share of those, drawn by a fixed generator (LEAF's `--sf`; every experiment seed sees the same
users). The test split is every test sample of the kept users; a test sample whose user has no
training samples (LEAF's `-t user` split) is scored globally, in no client's own test set.
"""

from __future__ import annotations

import re
import zlib
from typing import Any, ClassVar, Literal

import numpy as np
from pydantic import Field, model_validator

from fedhet.core.data_config import ArrayData, DataConfig, DataInfo, refusal
from fedhet.core.errors import InputError
from fedhet.core.rng import numpy_rng
from fedhet.data.leaf_files import LeafFolder, Samples, read_folder

Task = Literal["femnist", "shakespeare", "sent140"]
VOCABULARY = (  # LEAF's ALL_LETTERS (models/utils/language_utils.py), in its order
    "\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]abcdefghijklmnopqrstuvwxyz}"
)
WINDOW = 80  # Shakespeare's characters per sample (LEAF's SEQ_LENGTH)
WORDS = 25  # Sent140's words per tweet (LEAF's max_words)
WORD_IDS = 2**24 - 1  # hashed word ids 1..WORD_IDS: exact in float32
SHAPES = {"femnist": (1, 28, 28), "shakespeare": (1, 1, WINDOW), "sent140": (1, 1, WORDS)}
CLASSES = {"femnist": 62, "shakespeare": len(VOCABULARY), "sent140": 2}
_USER_SEED = 20250301  # fixed: the users sampled never depend on an experiment seed
_WORD = re.compile(r"[\w']+|[.,!?;]")  # LEAF's split_line


class LeafData(DataConfig):
    loader: ClassVar[str] = "fedhet.data.leaf:load"
    hashed_files: ClassVar[dict[str, str]] = {"sha256": "path"}

    dataset: Literal["leaf"] = "leaf"
    path: str = Field(
        description="the LEAF data folder (train/ and test/ of JSON files), relative to the "
        "working directory"
    )
    task: Task = Field(description="the LEAF task the folder holds")
    min_samples: int = Field(
        0, ge=0, description="keep the users with at least this many samples (LEAF's -k)"
    )
    user_fraction: float = Field(
        1.0, gt=0, le=1, description="the share of users kept, drawn once (LEAF's --sf)"
    )

    @model_validator(mode="after")
    def _readable(self) -> LeafData:
        try:
            self.users()
        except InputError as err:
            raise refusal("path", str(err).removeprefix(f"{self.path}: "), self.path) from None
        return self

    def folder(self) -> LeafFolder:
        return read_folder(self.path)

    def users(self) -> list[str]:
        """The kept users (see the module docstring), sorted: the training users come first,
        in name order, as clients 0..K-1."""
        return _kept(self.folder(), self.min_samples, self.user_fraction, self.path)

    def describe(self) -> DataInfo:
        folder, users = self.folder(), self.users()
        clients = sum(user in folder.train for user in users)
        samples = sum(len(folder.train[u][1]) for u in users if u in folder.train)
        shape, classes, text = SHAPES[self.task], CLASSES[self.task], self.task != "femnist"
        return DataInfo(shape, classes, samples, clients, tokens=text, client_tests=True)

    def identity(self) -> dict[str, Any]:
        found = {"sha256": self.folder().sha256, "task": self.task}
        if self.min_samples:
            found["min_samples"] = self.min_samples
        if self.user_fraction != 1:
            found["user_fraction"] = self.user_fraction
        return found


def _kept(folder: LeafFolder, min_samples: int, fraction: float, path: str) -> list[str]:
    train = sorted(folder.train)
    users = train + sorted(set(folder.test) - set(folder.train))

    def size(user: str) -> int:
        return sum(len(split[user][1]) for split in (folder.train, folder.test) if user in split)

    users = [u for u in users if size(u) >= min_samples]
    if fraction < 1 and users:
        count = max(1, round(fraction * len(users)))
        drawn = numpy_rng(_USER_SEED, "leaf-users").choice(len(users), count, replace=False)
        users = [users[i] for i in sorted(drawn)]
    if not any(u in folder.train for u in users):
        raise InputError(
            f"{path}: no training user kept (min_samples {min_samples}, user_fraction "
            f"{fraction}); lower data.min_samples or raise data.user_fraction"
        )
    return users


def load(config: LeafData, seed: int) -> ArrayData:
    """The kept users' samples as arrays (see the module docstring): those of the content the
    keys name, else InputError naming the folder that changed."""
    folder = config.folder()
    config.keyed_identity({**config.identity(), "sha256": folder.sha256})
    users = config.users()
    clients = {u: k for k, u in enumerate(u for u in users if u in folder.train)}
    train_x, train_y, train_client = _split(folder.train, users, clients, config, "train")
    test_x, test_y, test_client = _split(folder.test, users, clients, config, "test")
    return ArrayData(train_x, train_y, test_x, test_y, train_client, test_client)


def _split(
    split: dict[str, Samples],
    users: list[str],
    clients: dict[str, int],
    config: LeafData,
    name: str,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    present = [u for u in users if u in split]
    xs, ys, ids = [], [], []
    for user in present:
        x, y = split[user]
        where = f"{config.path}/{name}: user {user!r}"
        xs.append(ENCODERS[config.task](x, where))
        ys.append(_labels(config.task, y, where))
        ids.append(np.full(len(y), clients.get(user, -1), np.int64))
    shape = (0, *SHAPES[config.task])
    x = np.concatenate(xs) if xs else np.zeros(shape, np.float32)
    y = np.concatenate(ys) if ys else np.zeros(0, np.int64)
    return x, y, np.concatenate(ids) if ids else np.zeros(0, np.int64)


def _pixels(x: list[Any], where: str) -> np.ndarray:
    try:
        pixels = np.asarray(x, dtype=np.float32)
    except (TypeError, ValueError):
        pixels = None
    if pixels is None or pixels.ndim != 2 or pixels.shape[1] != 28 * 28:
        raise InputError(f"{where}: x is not a list of 784 pixel values per sample (28 x 28)")
    if not np.isfinite(pixels).all():
        raise InputError(f"{where}: x holds NaN or infinite pixel values")
    return pixels.reshape(-1, *SHAPES["femnist"])


_CHAR_IDS = {c: i for i, c in enumerate(VOCABULARY)}


def _characters(text: str, where: str) -> list[int]:
    unknown = next((c for c in text if c not in _CHAR_IDS), None)
    if unknown is not None:
        raise InputError(f"{where}: character {unknown!r} outside LEAF's 80-character vocabulary")
    return [_CHAR_IDS[c] for c in text]


def _windows(x: list[Any], where: str) -> np.ndarray:
    if not all(isinstance(s, str) and len(s) == WINDOW for s in x):
        raise InputError(f"{where}: x is not a list of {WINDOW}-character strings")
    ids = np.array([_characters(s, where) for s in x], dtype=np.float32)
    return ids.reshape(-1, *SHAPES["shakespeare"])


def _tweets(x: list[Any], where: str) -> np.ndarray:
    ids = np.zeros((len(x), WORDS), np.float32)
    for i, sample in enumerate(x):
        text = sample[4] if isinstance(sample, list) and len(sample) > 4 else sample
        if not isinstance(text, str):
            raise InputError(f"{where}: sample {i} has no tweet text (x[4] or a string)")
        words = _WORD.findall(text.lower())[:WORDS]
        ids[i, : len(words)] = [1 + zlib.crc32(w.encode()) % WORD_IDS for w in words]
    return ids.reshape(-1, *SHAPES["sent140"])


ENCODERS = {"femnist": _pixels, "shakespeare": _windows, "sent140": _tweets}


def _labels(task: str, y: list[Any], where: str) -> np.ndarray:
    if task == "shakespeare":
        if not all(isinstance(c, str) and len(c) == 1 for c in y):
            raise InputError(f"{where}: y is not a list of single characters")
        return np.array(_characters("".join(y), where), dtype=np.int64)
    classes = CLASSES[task]  # FedProx's FEMNIST stores labels as floats (3.0): whole ones pass
    if not all(_whole(v) and 0 <= v < classes for v in y):
        raise InputError(f"{where}: y holds a label outside the integers 0..{classes - 1}")
    return np.array(y, dtype=np.int64)


def _whole(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value == int(value)
