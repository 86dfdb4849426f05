"""Centralized training: the upper bound every federated method is compared with."""
