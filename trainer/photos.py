"""Preprocessed photos a retrain holds: stored in half precision, handed to a network or ONNX Runtime in float32.

A photo at 192 px is 0.44 MB in float32, and a retrain holds about 1,500 (gate, replay, expert labels, the unlabelled
pool's): the largest part of its memory on a device that shares 8 GB with its GPU. Half precision halves it for a
rounding far below what a network can tell: the preprocessing's values, ``(v / 255 - mean) / std`` of 8-bit pixels,
come back within 1.2e-7 for EfficientNet-Lite's ``(v - 127) / 128`` (one float32 rounding: each is a multiple of
1/128) and within 0.06 of one pixel level for ImageNet's mean and std. The release (:mod:`trainer.data`, on a
developer's machine) keeps float32, bit for bit the daemon's. Networks take a stored tensor as it is
(:class:`trainer.models.Classifier` casts at its input); anything else (augmentation, ONNX Runtime) is given
:func:`as_input` of it.
"""

from __future__ import annotations

import numpy as np
import torch

from engines.base import malloc_trim

__all__ = ["INFERENCE_BATCH", "STORED", "as_input", "empty", "photo", "stack"]

#: The precision photos are held in.
STORED = torch.float16

#: Photos a network is given at once outside training (scoring, features, BatchNorm statistics, evaluation):
#: EfficientNet-Lite0's inference at 192 px peaks 0.28 GB above the model for 16 photos, 0.43 GB for 32, 1.0 GB for 64
#: and 1.84 GB for 128 (rehearsal's selection once ran at 128, the field's BatchNorm statistics at 64: each the peak of
#: a whole retrain); evaluating 96 photos raised the peak by 357 MB at 32, 208 MB at 16 and 122 MB at 8, no slower
#: (the gate evaluated at 32 and was the peak of the real-daemon field loop's retrains, 1,426-1,592 MB).
INFERENCE_BATCH = 8


def photo(x: np.ndarray) -> torch.Tensor:
    """One preprocessed photo [3,H,W] (float32, from :func:`edge_agent.preprocess.preprocess_file`) as stored."""
    return torch.from_numpy(x).to(STORED)


def stack(photos: list[torch.Tensor]) -> torch.Tensor:
    """Stored photos as one [N,3,H,W] tensor; the heap the single photos took is handed back to the system."""
    out = torch.stack(photos)
    photos.clear()
    malloc_trim()
    return out


def empty(size: int = 128) -> torch.Tensor:
    """No photos, [0,3,size,size], in the stored precision (so joining it to photos keeps their precision)."""
    return torch.zeros(0, 3, size, size, dtype=STORED)


def as_input(x: torch.Tensor) -> torch.Tensor:
    """``x`` in float32, the precision networks, the augmentation and ONNX Runtime compute in (no copy if it is)."""
    return x if x.dtype == torch.float32 else x.float()
