"""The `images` dataset: a folder of image files, a subfolder per class, or per client and then
per class (a federation's sites, each with its own images).

    data: {dataset: images, path: scans, size: 32}

`path/<class>/<image>` or `path/<client>/<class>/<image>` (png, jpg, jpeg, bmp, gif); classes are
the class folders' names and clients the client folders' names, both in sorted order, so
`partition: {scheme: natural}` gives client k the k-th site's images. Images are read with
Pillow, resized to `size` x `size` (bilinear) when it is set (it must be when sizes differ), as
grey when every image is grey and as RGB otherwise, pixels scaled to [0, 1]. The test split, the
checks and the key are those of the `arrays` dataset (fedhet.data.arrays): the key hashes every
file's name and content.
"""

from __future__ import annotations

import hashlib
import io
import warnings
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import Field

from fedhet.core.errors import InputError
from fedhet.data.array_files import ArrayFile
from fedhet.data.arrays import ArraysData
from fedhet.data.folder_hash import Stamp, stamp

SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif")


class ImagesData(ArraysData):
    dataset: Literal["images"] = "images"
    path: str = Field(description="the folder of images, relative to the working directory")
    test: str | None = Field(None, description="the test split's folder; default: held out")
    size: int | None = Field(None, ge=4, le=1024, description="resize every image to this side")

    def read(self, path: str) -> ArrayFile:
        return read_folder(path, self.size)

    def identity_of(self, train: ArrayFile, test: ArrayFile | None) -> dict[str, Any]:
        return super().identity_of(train, test) | {"size": self.size}


def read_folder(path: str, size: int | None) -> ArrayFile:
    """The images under `path` as arrays (see the module docstring); InputError naming the
    folder and what to fix."""
    root = Path(path).expanduser().resolve()
    if not root.is_dir():
        raise InputError(f"{path}: folder not found; give a path relative to {Path.cwd()}")
    files = sorted(f for f in root.rglob("*") if f.suffix.lower() in SUFFIXES and f.is_file())
    return _read(root, stamp(files), size, path)  # read again when a file changes


@lru_cache(maxsize=4)
def _read(root: Path, files: Stamp, size: int | None, path: str) -> ArrayFile:
    parts = [Path(f).relative_to(root).parts for f, _, _ in files]
    depths = {len(p) for p in parts}
    if depths not in ({2}, {3}):
        raise InputError(
            f"{path}: no images in <class>/<image> or <client>/<class>/<image> subfolders; "
            "arrange them so (png, jpg, bmp or gif)"
        )
    names = tuple(sorted({p[-2] for p in parts}))
    digest, images = hashlib.sha256(), []
    for (name, _, _), relative in zip(files, parts, strict=True):
        content = Path(name).read_bytes()
        digest.update("/".join(relative).encode() + b"\0" + content)
        images.append(_image(content, size, f"{path}/{'/'.join(relative)}"))
    x = stacked_pixels(images, path, "set data.size to resize them all")
    y = np.array([names.index(p[-2]) for p in parts], dtype=np.int64)
    client = np.array([p[0] for p in parts]) if depths == {3} else None
    return ArrayFile(x, y, client, digest.hexdigest(), names)


def _image(content: bytes, size: int | None, where: str):
    from PIL import Image, UnidentifiedImageError

    try:
        with warnings.catch_warnings():  # Pillow's warning for a large image: refused here
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(content))
            image.load()
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise InputError(
            f"{where}: over {Image.MAX_IMAGE_PIXELS:,} pixels, more than fedhet reads (Pillow's "
            "guard against decompression bombs); shrink the image"
        ) from None
    except UnidentifiedImageError:  # Pillow's message names its BytesIO, not the file
        what = "an empty file (0 bytes)" if not content else "not an image Pillow can read"
        raise InputError(f"{where}: {what}; remove or replace it") from None
    except OSError as err:
        raise InputError(f"{where}: not a readable image ({err}); remove or replace it") from None
    if size is not None:
        image = image.resize((size, size), Image.Resampling.BILINEAR)
    return image


def stacked_pixels(images: list, path: str, fix: str) -> np.ndarray:
    """N x C x H x W pixels in [0, 1] of Pillow `images`: grey when every image is, else RGB;
    InputError naming `path` and saying how to `fix` it when their sizes differ."""
    sizes = {image.size for image in images}
    if len(sizes) > 1:
        shown = ", ".join(f"{w}x{h}" for w, h in sorted(sizes)[:3])
        raise InputError(f"{path}: images of sizes {shown}; {fix}")
    mode = "L" if all(image.mode in ("1", "L") for image in images) else "RGB"
    pixels = np.stack([np.asarray(image.convert(mode)) for image in images])
    pixels = pixels[:, None] if mode == "L" else pixels.transpose(0, 3, 1, 2)
    return pixels.astype(np.float32) / 255
