"""GroupDRO (Sagawa et al., ICLR 2020) as a federated baseline, adapted as FedBR's code does
(Guo et al., ICML 2023, Table 1): the groups are the clients."""
