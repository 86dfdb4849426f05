"""VHL's virtual data: untrained generators for a labeled noise dataset, and SupCon calibration."""

from fedhet.methods.vhl.generators import GeneratorKind, generate, save_grid
from fedhet.methods.vhl.stylegan2 import StyleGAN2Config, StyleGAN2Generator
from fedhet.methods.vhl.supcon import supcon_loss, vhl_calibration_loss

__all__ = [
    "GeneratorKind",
    "StyleGAN2Config",
    "StyleGAN2Generator",
    "generate",
    "save_grid",
    "supcon_loss",
    "vhl_calibration_loss",
]
