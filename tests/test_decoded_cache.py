"""The decoded-data cache (fedhet.data.decoded): a source is decoded once, a later load reads
the kept .npy (a plain NumPy file), and a changed source is decoded anew."""

from __future__ import annotations

import os

import numpy as np
import pytest

from fedhet.data.decoded import decoded, entry


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDHET_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def counting_decoder(calls: list):
    def decode(path):
        calls.append(path)
        return np.frombuffer(path.read_bytes(), dtype=np.uint8).reshape(-1, 2)

    return decode


def test_a_source_is_decoded_once_and_read_back_equal(tmp_path, cache):
    source = tmp_path / "images.gz"
    source.write_bytes(bytes(range(10)))
    calls: list = []
    first = decoded(source, counting_decoder(calls))
    second = decoded(source, counting_decoder(calls))
    assert len(calls) == 1
    assert np.array_equal(first, second) and second.dtype == np.uint8 and second.shape == (5, 2)
    assert np.array_equal(np.load(entry(source)), first)  # readable by anything reading .npy
    assert entry(source).parent.parent == cache


def test_a_changed_source_is_decoded_anew(tmp_path, cache):
    source = tmp_path / "images.gz"
    source.write_bytes(bytes(range(10)))
    calls: list = []
    decoded(source, counting_decoder(calls))
    source.write_bytes(bytes(range(12)))
    os.utime(source, ns=(1, 1))
    assert decoded(source, counting_decoder(calls)).shape == (6, 2)
    assert len(calls) == 2


def test_an_unwritable_cache_decodes_every_time(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("FEDHET_CACHE", str(blocker))  # a file: no folder can be made in it
    source = tmp_path / "images.gz"
    source.write_bytes(bytes(range(4)))
    calls: list = []
    for _ in range(2):
        assert decoded(source, counting_decoder(calls)).shape == (2, 2)
    assert len(calls) == 2
