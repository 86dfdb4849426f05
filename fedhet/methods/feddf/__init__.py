"""FedDF (Lin, Kong, Stich and Jaggi, NeurIPS 2020): ensemble distillation for model fusion."""
