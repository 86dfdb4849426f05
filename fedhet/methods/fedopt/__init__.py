"""The FedOpt family: FedAdam, FedYogi, FedAdagrad (Reddi et al. 2021); FedAvgM (Hsu et al. 2019)"""
