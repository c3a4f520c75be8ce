"""Preprocessed photos a retrain holds: as 8-bit codes or in half precision, handed to a network or ONNX Runtime in float32.

A photo at 192 px is 0.44 MB in float32 (0.79 MB at 256), and a retrain holds about 1,500 (gate, replay, expert
labels, the unlabelled pool's): the largest part of its memory on a device that shares 8 GB with its GPU. A photo
whose every value is ``(c - 127) / 128`` for a whole ``c`` in 0..255 (EfficientNet-Lite's input, which is its 8-bit
pixels: the daemon's float32 computes it within 1.2e-7) is held as those codes, a quarter of float32, and comes back
within 1.2e-7 of the daemon's values; any other photo (ImageNet's mean and std, LeafNet's) is held in half precision,
within 0.06 of one pixel level. Which one is decided by the values alone, so no caller names a preprocessing. The
release (:mod:`trainer.data`, on a developer's machine) keeps float32, bit for bit the daemon's. Networks take a
stored tensor as it is (:class:`trainer.models.Classifier` casts at its input); anything else (augmentation, ONNX
Runtime, the image checks) is given :func:`as_input` (or :func:`as_array`, :func:`image_view`) of it, and stored
photos of different precisions are joined only by :func:`join`, never by ``torch.cat`` (which would read codes as
values).
"""

from __future__ import annotations

import numpy as np
import torch

from engines.base import malloc_trim

__all__ = ["CODES", "INFERENCE_BATCH", "STORED", "as_array", "as_input", "empty", "image_view", "join", "photo", "stack"]

#: The precision photos are held in when they are not 8-bit codes.
STORED = torch.float16

#: 8-bit codes ``c`` of a photo whose values are ``(c - 127) / 128``.
CODES = torch.uint8

#: How far a value may be from ``(c - 127) / 128`` for the photo to be held as codes (in units of ``c``): the daemon's
#: float32 is within 1.6e-5 of it, ImageNet's normalisation is not near it on any real photo.
_CODE_TOLERANCE = 1e-3

#: Photos a network is given at once outside training (scoring, features, BatchNorm statistics, evaluation):
#: EfficientNet-Lite0's inference at 192 px peaks 0.28 GB above the model for 16 photos, 0.43 GB for 32, 1.0 GB for 64
#: and 1.84 GB for 128 (rehearsal's selection once ran at 128, the field's BatchNorm statistics at 64: each the peak of
#: a whole retrain); evaluating 96 photos raised the peak by 357 MB at 32, 208 MB at 16 and 122 MB at 8, no slower
#: (the gate evaluated at 32 and was the peak of the real-daemon field loop's retrains, 1,426-1,592 MB).
INFERENCE_BATCH = 8


def photo(x: np.ndarray) -> torch.Tensor:
    """One preprocessed photo [3,H,W] (float32, from :func:`edge_agent.preprocess.preprocess_file`) as stored."""
    codes = x * np.float32(128) + np.float32(127)
    whole = np.rint(codes)
    if x.size and whole.min() >= 0 and whole.max() <= 255 and float(np.abs(codes - whole).max()) <= _CODE_TOLERANCE:
        return torch.from_numpy(whole.astype(np.uint8))
    return torch.from_numpy(x).to(STORED)


def join(parts: list[torch.Tensor]) -> torch.Tensor:
    """Stored photos [N_i,3,H,W] as one tensor along the first axis, in one precision: codes stay codes when every
    part with photos is codes; otherwise codes are decoded into the others' precision (never read as values)."""
    full = [p for p in parts if len(p)] or parts[:1]
    dtypes = {p.dtype for p in full}
    if len(dtypes) > 1:
        target = torch.float32 if torch.float32 in dtypes else STORED
        full = [as_input(p).to(target) for p in full]
    return torch.cat(full)


def stack(photos: list[torch.Tensor]) -> torch.Tensor:
    """Stored photos as one [N,3,H,W] tensor; the heap the single photos took is handed back to the system."""
    out = join([p.unsqueeze(0) for p in photos]) if photos else torch.stack(photos)
    photos.clear()
    malloc_trim()
    return out


def empty(size: int = 128) -> torch.Tensor:
    """No photos, [0,3,size,size] (:func:`join` gives photos joined to it their own precision)."""
    return torch.zeros(0, 3, size, size, dtype=STORED)


def as_input(x: torch.Tensor) -> torch.Tensor:
    """``x`` in float32, the precision networks, the augmentation and ONNX Runtime compute in (no copy if it is)."""
    if x.dtype == CODES:
        return x.float().sub_(127).div_(128)
    return x if x.dtype == torch.float32 else x.float()


def as_array(x: np.ndarray | torch.Tensor) -> np.ndarray:
    """Stored photos (a tensor or its numpy view, as ONNX Runtime is given a batch at a time) in float32, decoded by
    :func:`as_input`."""
    return as_input(torch.as_tensor(x)).numpy()


def image_view(x: np.ndarray | torch.Tensor, mean, std) -> tuple[np.ndarray, tuple, tuple]:
    """Stored photos (or their numpy view) as the image checks read them, without a float32 copy: (array, mean, std)
    with ``array * std + mean`` the [0,1] pixels (codes are pixels times 255)."""
    a = x.numpy() if isinstance(x, torch.Tensor) else x
    if a.dtype == np.uint8:
        return a, (0.0, 0.0, 0.0), (1 / 255, 1 / 255, 1 / 255)
    return a, tuple(mean), tuple(std)
