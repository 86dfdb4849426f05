"""ClientData.rows / take_rows: the samples an index names, as indexing gives them."""

from __future__ import annotations

import pytest
import torch

from fedhet.data.clients import ClientData, take_rows


@pytest.mark.parametrize("index_shape", [(7,), (3, 4), (0,)])
def test_take_rows_is_indexing(index_shape):
    gen = torch.Generator().manual_seed(0)
    images = torch.randn(9, 1, 5, 5, generator=gen)
    index = torch.randint(9, index_shape, generator=gen)
    got = take_rows(images, index)
    assert got.shape == images[index].shape
    assert torch.equal(got, images[index])


def test_rows_gives_the_samples_and_their_labels():
    data = ClientData(0, torch.arange(12.0).view(6, 2), torch.arange(6))
    x, y = data.rows(torch.tensor([4, 1]))
    assert torch.equal(x, torch.tensor([[8.0, 9.0], [2.0, 3.0]]))
    assert torch.equal(y, torch.tensor([4, 1]))
