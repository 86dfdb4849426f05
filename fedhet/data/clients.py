"""One client's samples, on the device it trains on."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class ClientData:
    id: int
    x: torch.Tensor
    y: torch.Tensor

    @property
    def n(self) -> int:
        return self.y.shape[0]  # len() of a tensor goes through Python: rounds ask ~10^5 times
