"""FedAvg + Mixup: FedAvg whose clients train with input mixup (Zhang et al., ICLR 2018)."""
