"""Griffin-Lim vocoding: a mel becomes audio without any trained vocoder.

So a freshly trained acoustic model speaks at once; a neural vocoder replaces it
later through the same call shape (log mel in, waveform out). This is the fast
variant with momentum (Perraudin, Balazs and Sondergaard, 2013), run on the
same STFT framing as `voicesmith.audio.mel_spectrogram`, so the audio it
returns has exactly `T * hop_length` samples for `T` mel frames.
"""

from __future__ import annotations

from functools import lru_cache

import torch

from voicesmith.audio import istft, magnitude_spectrogram, mel_filterbank, stft
from voicesmith.config import AudioConfig

_PHASE_SEED = 0


@lru_cache(maxsize=8)
def _inverse_filterbank(cfg_json: str, device: torch.device) -> torch.Tensor:
    """Pseudo-inverse of the mel filterbank `[n_fft // 2 + 1, n_mels]`, computed once in float64."""
    weights = mel_filterbank(AudioConfig.model_validate_json(cfg_json), "cpu", torch.float64)
    return torch.linalg.pinv(weights).float().to(device)


def mel_to_magnitude(log_mel: torch.Tensor, cfg: AudioConfig) -> torch.Tensor:
    """Log mel `[..., n_mels, T]` -> linear magnitude `[..., n_fft // 2 + 1, T]` (pseudo-inverse, >= 0)."""
    inverse = _inverse_filterbank(cfg.model_dump_json(), log_mel.device)
    return torch.clamp(torch.matmul(inverse, torch.exp(log_mel.float())), min=0.0)


def griffin_lim(log_mel: torch.Tensor, cfg: AudioConfig, n_iters: int = 32, momentum: float = 0.99) -> torch.Tensor:
    """Log mel `[n_mels, T]` or `[B, n_mels, T]` -> audio `[T * hop]` or `[B, T * hop]` on the same device.

    The starting phase is drawn from a fixed seed, so the same mel always
    gives the same audio.
    """
    if not 0 <= momentum < 1:
        raise ValueError(f"momentum must be in [0, 1); got {momentum}")
    single = log_mel.dim() == 2
    batch = log_mel[None] if single else log_mel
    with torch.no_grad():
        magnitude = mel_to_magnitude(batch, cfg)
        generator = torch.Generator().manual_seed(_PHASE_SEED)
        phase = torch.rand(magnitude.shape, generator=generator).to(magnitude.device) * (2 * torch.pi)
        angles = torch.polar(torch.ones_like(magnitude), phase)
        previous = torch.zeros_like(angles)
        for _ in range(n_iters):  # in-place updates: complex element-wise ops dominate the run time
            rebuilt = stft(istft(angles.mul_(magnitude), cfg), cfg)
            angles = torch.sub(rebuilt, previous, alpha=momentum / (1 + momentum))
            power = angles.real.square().addcmul_(angles.imag, angles.imag)  # |z|^2 without complex abs
            angles.mul_(power.clamp_(min=1e-32).rsqrt_())
            previous = rebuilt
        audio = istft(angles.mul_(magnitude), cfg)
    return audio[0] if single else audio


def spectral_convergence(audio: torch.Tensor, log_mel: torch.Tensor, cfg: AudioConfig) -> float:
    """|| |STFT(audio)| - target || / || target || with the target magnitude taken from the mel: lower is better."""
    target = mel_to_magnitude(log_mel, cfg)
    rebuilt = magnitude_spectrogram(audio, cfg)
    return float(torch.linalg.norm(rebuilt - target) / torch.linalg.norm(target))
