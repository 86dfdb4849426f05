"""FedPer (Arivazhagan et al., 2019): federated base layers, personal layers kept on each client."""
