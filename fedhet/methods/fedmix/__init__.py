"""FedMix (Yoon et al., ICLR 2021): approximate mixup with the means other clients share."""
