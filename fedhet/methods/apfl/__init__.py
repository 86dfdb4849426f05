"""APFL (Deng, Kamani, Mahdavi 2020): a learned mixture of a local and the global model."""
