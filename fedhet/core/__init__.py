"""The small core: specs, keys, the artifact store, the stage pipeline and the method registry."""
