"""DANN (Ganin et al., JMLR 2016) as a federated baseline, adapted as FedBR's code does (Guo et
al., ICML 2023, Table 1): the domains are the clients."""
