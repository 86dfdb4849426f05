"""MOON: model-contrastive federated learning (Li, He, Song, CVPR 2021)."""
