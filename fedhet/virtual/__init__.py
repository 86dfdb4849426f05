"""VHL's virtual data: untrained generators for a labeled noise dataset, and SupCon calibration."""

from fedhet.virtual.generators import GeneratorKind, generate, save_grid
from fedhet.virtual.stylegan2 import StyleGAN2Config, StyleGAN2Generator
from fedhet.virtual.supcon import supcon_loss, vhl_calibration_loss

__all__ = [
    "GeneratorKind",
    "StyleGAN2Config",
    "StyleGAN2Generator",
    "generate",
    "save_grid",
    "supcon_loss",
    "vhl_calibration_loss",
]
