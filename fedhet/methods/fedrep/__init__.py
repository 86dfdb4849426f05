"""FedRep (Collins et al., 2021): a shared representation, each client's own head."""
