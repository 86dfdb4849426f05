"""FedTAN: federated learning with BatchNorm statistics and their gradients aggregated."""

from fedhet.methods.fedtan.sync_bn import (
    LayerStatistics,
    SyncResult,
    bn_layers,
    communication_cost,
    synchronized_gradients,
)

__all__ = [
    "LayerStatistics",
    "SyncResult",
    "bn_layers",
    "communication_cost",
    "synchronized_gradients",
]
