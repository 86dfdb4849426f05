"""FedBABU (Oh et al., 2022): the body federated under a frozen random head, then fine-tuned."""
