"""TCT (Train-Convexify-Train): eNTK features of a bootstrapped model and stage-2 regression."""
