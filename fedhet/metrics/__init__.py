"""Metrics derived from runs: summaries and the client gradient variance."""
