"""Neural vocoders (log-mel -> waveform): HiFi-GAN V1/V2/V3 and Vocos-style, trained as GANs."""

from voicesmith.models.vocoder.generators import build_generator
from voicesmith.models.vocoder.istft import InverseStft
from voicesmith.models.vocoder.model import VocoderModel, VocoderOutput
from voicesmith.models.vocoder.vocos import VocosGenerator

__all__ = ["InverseStft", "VocoderModel", "VocoderOutput", "VocosGenerator", "build_generator"]
