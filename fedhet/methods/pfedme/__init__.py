"""pFedMe (T. Dinh, Tran, Nguyen, NeurIPS 2020): personalized models through Moreau envelopes."""
