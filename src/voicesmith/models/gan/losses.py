"""LSGAN losses of HiFi-GAN / VITS, always computed in fp32 (autocast off) for stable mixed precision.

`scores` are lists with one tensor per sub-discriminator; `features` are lists (per sub-discriminator)
of lists of feature maps, as the discriminators in `discriminators.py` return them.
"""

from __future__ import annotations

from typing import TypeVar

import torch
from torch import Tensor

Nested = TypeVar("Nested", list, Tensor)


def _fp32(device: torch.device):
    return torch.autocast(device.type, enabled=False)


def discriminator_loss(real_scores: list[Tensor], fake_scores: list[Tensor]) -> Tensor:
    """Sum over sub-discriminators of mean((1 - real)^2) + mean(fake^2); 0 when real=1 and fake=0."""
    with _fp32(real_scores[0].device):
        return sum(torch.mean((1 - real.float()) ** 2) + torch.mean(fake.float() ** 2)
                   for real, fake in zip(real_scores, fake_scores))


def generator_adversarial_loss(fake_scores: list[Tensor]) -> Tensor:
    """Sum over sub-discriminators of mean((1 - fake)^2); 0 when every fake scores 1."""
    with _fp32(fake_scores[0].device):
        return sum(torch.mean((1 - fake.float()) ** 2) for fake in fake_scores)


def feature_matching_loss(real_features: list[list[Tensor]], fake_features: list[list[Tensor]]) -> Tensor:
    """2 x sum of mean |real - fake| over every feature map; the real side is detached (no gradient)."""
    with _fp32(fake_features[0][0].device):
        total = sum(torch.mean(torch.abs(real.detach().float() - fake.float()))
                    for reals, fakes in zip(real_features, fake_features)
                    for real, fake in zip(reals, fakes))
        return total * 2


def split_real_fake(batched: Nested, n_real: int) -> tuple[Nested, Nested]:
    """Undo batching real and fake audio into one discriminator pass.

    `batched` is a tensor `[n_real + n_fake, ...]` or a (nested) list of such tensors (scores or
    features); returns (the first `n_real` rows, the rest) with the same nesting.
    """
    if isinstance(batched, Tensor):
        return batched[:n_real], batched[n_real:]
    pairs = [split_real_fake(item, n_real) for item in batched]
    return [real for real, _ in pairs], [fake for _, fake in pairs]
