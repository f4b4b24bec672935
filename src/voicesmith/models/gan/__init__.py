"""GAN parts shared by VITS and the vocoders: HiFi-GAN generator, discriminators, LSGAN losses."""

from voicesmith.models.gan.discriminators import (
    CombinedDiscriminator,
    DiscriminatorP,
    DiscriminatorR,
    DiscriminatorS,
    MultiPeriodDiscriminator,
    MultiResolutionDiscriminator,
)
from voicesmith.models.gan.generator import HifiGanGenerator, ResBlock1, ResBlock2, strip_weight_norm
from voicesmith.models.gan.losses import (
    discriminator_loss,
    feature_matching_loss,
    generator_adversarial_loss,
    split_real_fake,
)

__all__ = [
    "CombinedDiscriminator", "DiscriminatorP", "DiscriminatorR", "DiscriminatorS", "HifiGanGenerator",
    "MultiPeriodDiscriminator", "MultiResolutionDiscriminator", "ResBlock1", "ResBlock2",
    "discriminator_loss", "feature_matching_loss", "generator_adversarial_loss", "split_real_fake",
    "strip_weight_norm",
]
