"""Datasets, client partitions and the partition stage."""
