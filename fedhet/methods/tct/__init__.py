"""TCT (Train-Convexify-Train): eNTK features of a bootstrapped model and stage-2 regression."""

from fedhet.methods.tct.entk import (
    FeatureMoments,
    coordinate_mask,
    entk_features,
    entk_features_loop,
    iter_entk_chunks,
    reinit_head,
    trainable_parameter_count,
)
from fedhet.methods.tct.regression import (
    RegressionResult,
    centered_one_hot,
    lstsq_loss,
    predict,
    solve,
)

__all__ = [
    "FeatureMoments",
    "RegressionResult",
    "centered_one_hot",
    "coordinate_mask",
    "entk_features",
    "entk_features_loop",
    "iter_entk_chunks",
    "lstsq_loss",
    "predict",
    "reinit_head",
    "solve",
    "trainable_parameter_count",
]
