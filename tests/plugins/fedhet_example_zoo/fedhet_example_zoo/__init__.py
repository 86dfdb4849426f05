"""An example fedhet plug-in of a dataset (`blobs`) and a model (`twolayer`)."""
