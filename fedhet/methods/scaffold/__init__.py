"""SCAFFOLD (Karimireddy et al., 2020)."""
