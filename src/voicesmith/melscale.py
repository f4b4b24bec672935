"""Slaney's mel scale and filterbank in numpy alone, for code that must not import torch.

`voicesmith.audio` builds its mel spectrogram on these filters; `voicesmith.dnsmos` builds DNSMOS's
P.808 features on them (with the bin frequencies of an odd-sized FFT). A leaf: numpy only.
"""

from __future__ import annotations

import math
from typing import Optional

import numpy as np


def hz_to_mel(hz: np.ndarray) -> np.ndarray:
    """Slaney's mel scale (librosa's default, htk=False): linear below 1 kHz, logarithmic above."""
    hz = np.asarray(hz, dtype=np.float64)
    linear = hz / (200.0 / 3)
    log_part = 15.0 + np.log(np.maximum(hz, 1e-10) / 1000.0) / (math.log(6.4) / 27.0)
    return np.where(hz >= 1000.0, log_part, linear)


def mel_to_hz(mel: np.ndarray) -> np.ndarray:
    mel = np.asarray(mel, dtype=np.float64)
    linear = mel * (200.0 / 3)
    log_part = 1000.0 * np.exp((math.log(6.4) / 27.0) * (mel - 15.0))
    return np.where(mel >= 15.0, log_part, linear)


def slaney_filterbank(sample_rate: int, n_fft: int, n_mels: int, f_min: float, f_max: float,
                      bin_hz: Optional[np.ndarray] = None) -> np.ndarray:
    """Triangular filters evenly spaced in mel, each scaled to unit area in Hz (slaney normalisation).

    Returns `[n_mels, n_fft // 2 + 1]`. `bin_hz` are the centre frequencies of the FFT bins; by default
    `n_fft // 2 + 1` points evenly from 0 to sample_rate / 2, which are the bins of an even-sized FFT
    (librosa < 0.10 used this grid for every size; since 0.10 it uses `np.fft.rfftfreq`, which differs
    for odd sizes).
    """
    fft_hz = np.linspace(0.0, sample_rate / 2, n_fft // 2 + 1) if bin_hz is None else np.asarray(bin_hz, np.float64)
    edges_hz = mel_to_hz(np.linspace(hz_to_mel(f_min), hz_to_mel(f_max), n_mels + 2))
    widths = np.diff(edges_hz)
    distance = edges_hz[:, None] - fft_hz[None, :]
    rising = -distance[:-2] / widths[:-1, None]
    falling = distance[2:] / widths[1:, None]
    weights = np.maximum(0.0, np.minimum(rising, falling))
    return weights * (2.0 / (edges_hz[2:] - edges_hz[:-2]))[:, None]
