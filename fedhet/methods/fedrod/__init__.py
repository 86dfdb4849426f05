"""FedRoD (Chen & Chao, 2022): a generic head (balanced softmax) and a personalized head."""
