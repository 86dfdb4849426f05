"""The federated engine: the algorithm interface, local training, the round loop, the train
stage."""
