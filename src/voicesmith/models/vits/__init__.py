"""VITS (text -> waveform): model.py composes the text encoder, posterior encoder, flow, duration
predictor, the HiFi-GAN decoder and the discriminators of `models/gan`."""

from voicesmith.models.vits.model import VitsModel, VitsOutput, build_vits_model

__all__ = ["VitsModel", "VitsOutput", "build_vits_model"]
