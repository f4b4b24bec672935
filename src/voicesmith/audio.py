"""Audio in and out, level statistics and the mel spectrogram every model shares.

The mel follows the HiFi-GAN convention (librosa's slaney filterbank, reflect
padding of (n_fft - hop) / 2, no centring, log with a 1e-5 floor) so that mels,
vocoders and published checkpoints line up, and so that a clip of N samples
gives exactly N // hop frames: audio and mel frames never drift apart.
"""

from __future__ import annotations

import math
from functools import lru_cache
from pathlib import Path

import numpy as np
import soundfile as sf
import soxr
import torch
import torch.nn.functional as F

from voicesmith.config import AudioConfig
from voicesmith.errors import DataError
from voicesmith.fileio import atomic_write
from voicesmith.melscale import slaney_filterbank

MEL_FLOOR = math.log(1e-5)
"""The log-mel value of silence: the pad value of mel batches."""

SILENCE_DBFS = -120.0
"""What `rms_dbfs` reports for digital silence (a finite number, so reports stay valid JSON)."""

_MAGNITUDE_EPS = 1e-9
_CLIP_LEVEL = 0.999


# ---------------------------------------------------------------- files


def load_audio(path: Path) -> tuple[np.ndarray, int]:
    """Read any file libsndfile knows as float32 `[channels, samples]` at its own sample rate."""
    path = Path(path)
    try:
        data, sample_rate = sf.read(str(path), dtype="float32", always_2d=True)
    except (sf.LibsndfileError, RuntimeError, OSError) as error:
        raise DataError(f"Cannot read the audio file {path}: {error}. Check that it exists and is a "
                        f"WAV/FLAC/OGG file that other players can open; re-export it if it is damaged.") from error
    if data.shape[0] == 0:
        raise DataError(f"The audio file {path} holds no samples. Re-record or remove this item.")
    return np.ascontiguousarray(data.T), int(sample_rate)


def write_wav(path: Path, audio: np.ndarray, sample_rate: int) -> None:
    """Write mono 16-bit PCM atomically (temporary file + rename): a crash never leaves half a file."""
    path = Path(path)
    audio = np.asarray(audio, dtype=np.float32).squeeze()
    if audio.ndim != 1:
        raise ValueError(f"write_wav takes mono audio [samples]; got shape {audio.shape} for {path}")
    if not np.isfinite(audio).all():
        raise ValueError(f"refusing to write {path}: the audio holds NaN or infinite samples")
    atomic_write(path, lambda handle: sf.write(handle, np.clip(audio, -1.0, 1.0), int(sample_rate),
                                               subtype="PCM_16", format="WAV"), durable=False)


def check_wav(path: Path, sample_rate: int) -> list[str]:
    """What is wrong with a WAV for training (rate, channels, sample format, silence, NaN); [] when fine."""
    path = Path(path)
    try:
        info = sf.info(str(path))
        data, _ = sf.read(str(path), dtype="float32", always_2d=True)
    except (sf.LibsndfileError, RuntimeError, OSError) as error:
        return [f"{path}: cannot be read ({error})"]
    problems = []
    if info.samplerate != sample_rate:
        problems.append(f"{path}: sample rate is {info.samplerate} Hz, expected {sample_rate} Hz")
    if info.channels != 1:
        problems.append(f"{path}: has {info.channels} channels, expected mono")
    if info.subtype != "PCM_16":
        problems.append(f"{path}: sample format is {info.subtype}, expected 16-bit PCM (PCM_16)")
    if data.size == 0:
        problems.append(f"{path}: holds no samples")
    elif not np.isfinite(data).all():
        problems.append(f"{path}: holds NaN or infinite samples")
    elif peak(data) < 1e-4:
        problems.append(f"{path}: is silent (peak {peak(data):.1e}, below -80 dBFS)")
    return problems


# ---------------------------------------------------------------- fix-ups


def to_mono(audio: np.ndarray) -> np.ndarray:
    """Average the channels of `[channels, samples]` (a 1-D input is already mono)."""
    audio = np.asarray(audio, dtype=np.float32)
    return audio if audio.ndim == 1 else audio.mean(axis=0)


def resample(audio: np.ndarray, sr_from: int, sr_to: int) -> np.ndarray:
    """Resample mono audio with soxr's high-quality filter."""
    audio = np.asarray(audio, dtype=np.float32)
    if sr_from == sr_to:
        return audio
    return soxr.resample(audio, sr_from, sr_to, quality="HQ").astype(np.float32, copy=False)


def trim_silence(audio: np.ndarray, sample_rate: int, top_db: float,
                 frame_seconds: float = 0.05) -> tuple[np.ndarray, float, float]:
    """Cut leading/trailing stretches more than `top_db` below the loudest frame.

    Frames overlap by 3/4 and the kept span runs to the end of the last loud
    frame, so soft onsets and decays are kept rather than clipped. Returns the
    trimmed audio and the seconds removed at the start and at the end; audio
    that is silent throughout comes back empty.
    """
    audio = np.asarray(audio, dtype=np.float32)
    frame = max(1, round(frame_seconds * sample_rate))
    hop = max(1, frame // 4)
    if audio.size <= frame:
        return audio, 0.0, 0.0
    frames = np.lib.stride_tricks.sliding_window_view(audio, frame)[::hop]
    frame_rms = np.sqrt(np.mean(np.square(frames, dtype=np.float64), axis=1))
    if frame_rms.max() <= 0:
        return audio[:0], audio.size / sample_rate, 0.0
    loud = np.flatnonzero(20 * np.log10(np.maximum(frame_rms, 1e-12) / frame_rms.max()) > -top_db)
    start = int(loud[0] * hop)
    end = audio.size if loud[-1] == len(frame_rms) - 1 else int(loud[-1] * hop + frame)  # the tail no frame covers
    return audio[start:end], start / sample_rate, (audio.size - end) / sample_rate


# ---------------------------------------------------------------- levels


def peak(audio: np.ndarray) -> float:
    """Largest absolute sample (1.0 = full scale)."""
    audio = np.asarray(audio)
    return float(np.abs(audio).max()) if audio.size else 0.0


def rms_dbfs(audio: np.ndarray) -> float:
    """Root-mean-square level in dB relative to full scale; `SILENCE_DBFS` for digital silence."""
    audio = np.asarray(audio, dtype=np.float64)
    rms = math.sqrt(float(np.mean(np.square(audio)))) if audio.size else 0.0
    return max(SILENCE_DBFS, 20 * math.log10(rms)) if rms > 0 else SILENCE_DBFS


def clipped_fraction(audio: np.ndarray, level: float = _CLIP_LEVEL) -> float:
    """Fraction of samples at (or within 0.1 % of) full scale: a sign of clipping when it is not tiny."""
    audio = np.asarray(audio)
    return float(np.mean(np.abs(audio) >= level)) if audio.size else 0.0


# ---------------------------------------------------------------- mel


def _f_max(cfg: AudioConfig) -> float:
    return float(cfg.f_max) if cfg.f_max is not None else cfg.sample_rate / 2


@lru_cache(maxsize=32)
def _cached_filterbank(sample_rate: int, n_fft: int, n_mels: int, f_min: float, f_max: float,
                       device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    weights = slaney_filterbank(sample_rate, n_fft, n_mels, f_min, f_max)
    return torch.from_numpy(weights).to(device=device, dtype=dtype)


def mel_filterbank(cfg: AudioConfig, device: torch.device | str = "cpu",
                   dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """`[n_mels, n_fft // 2 + 1]`, equal to `librosa.filters.mel(htk=False, norm="slaney")`; cached."""
    return _cached_filterbank(cfg.sample_rate, cfg.n_fft, cfg.n_mels, float(cfg.f_min), _f_max(cfg),
                              torch.device(device), dtype)


@lru_cache(maxsize=32)
def hann_window(win_length: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """The (periodic) analysis window, cached per device: allocating it every step shows up in profiles."""
    return torch.hann_window(win_length, device=device, dtype=dtype)


def stft_padding(cfg: AudioConfig) -> tuple[int, int]:
    """Reflect padding (left, right) that makes a clip of N samples give exactly N // hop frames."""
    total = cfg.n_fft - cfg.hop_length
    return total // 2, total - total // 2


def stft(audio: torch.Tensor, cfg: AudioConfig) -> torch.Tensor:
    """`[..., samples]` -> complex `[..., n_fft // 2 + 1, samples // hop]` (HiFi-GAN framing)."""
    if not audio.is_floating_point() or audio.dtype in (torch.float16, torch.bfloat16):
        audio = audio.float()
    left, right = stft_padding(cfg)
    n_samples = audio.shape[-1]
    if n_samples <= max(left, right) or n_samples < cfg.hop_length:
        raise ValueError(f"a mel spectrogram needs more than {max(left, right, cfg.hop_length - 1)} "
                         f"samples; got {n_samples}")
    flat = audio.reshape(-1, 1, n_samples)
    padded = F.pad(flat, (left, right), mode="reflect").squeeze(1)
    spec = torch.stft(padded, cfg.n_fft, hop_length=cfg.hop_length, win_length=cfg.win_length,
                      window=hann_window(cfg.win_length, audio.device, audio.dtype),
                      center=False, normalized=False, onesided=True, return_complex=True)
    return spec.reshape(*audio.shape[:-1], *spec.shape[-2:])


def _overlap_add(frames: torch.Tensor, hop: int) -> torch.Tensor:
    """`[B, T, n]` frames placed every `hop` samples and summed -> `[B, (T - 1) * hop + n]`.

    Done as ceil(n / hop) shifted adds of whole hop-sized blocks, which is far
    faster than F.fold on CPU and works the same on every device.
    """
    batch, n_frames, length = frames.shape
    blocks = -(-length // hop)
    if blocks * hop != length:
        frames = F.pad(frames, (0, blocks * hop - length))
    blocked = frames.reshape(batch, n_frames, blocks, hop)
    out = frames.new_zeros(batch, n_frames + blocks - 1, hop)
    for block in range(blocks):
        out[:, block:block + n_frames] += blocked[:, :, block]
    return out.reshape(batch, -1)[:, :(n_frames - 1) * hop + length]


def istft(spec: torch.Tensor, cfg: AudioConfig) -> torch.Tensor:
    """Inverse of `stft` (windowed overlap-add): complex `[..., freq, T]` -> `[..., T * hop]`.

    torch.istft refuses `center=False` with a Hann window (the window envelope
    is zero at the outer edges), so overlap-add is done here; the edges where
    the envelope vanishes are exactly the reflect padding, which is cut off.
    """
    batch_shape, n_frames = spec.shape[:-2], spec.shape[-1]
    window = hann_window(cfg.win_length, spec.device, torch.float32)
    window = F.pad(window, ((cfg.n_fft - cfg.win_length) // 2, (cfg.n_fft - cfg.win_length + 1) // 2))
    frames = torch.fft.irfft(spec.reshape(-1, *spec.shape[-2:]).transpose(-1, -2), n=cfg.n_fft) * window
    signal = _overlap_add(frames, cfg.hop_length)
    envelope = _overlap_add(window.square().expand(1, n_frames, -1), cfg.hop_length)[0]
    left, _ = stft_padding(cfg)
    keep = slice(left, left + n_frames * cfg.hop_length)
    return (signal[:, keep] / envelope[keep].clamp(min=1e-8)).reshape(*batch_shape, -1)


def magnitude_spectrogram(audio: torch.Tensor, cfg: AudioConfig) -> torch.Tensor:
    """`[..., samples]` -> linear magnitude `[..., n_fft // 2 + 1, samples // hop]`."""
    spec = stft(audio, cfg)
    power = spec.real.square()  # in place from here: a third of the time of out-of-place ops, autograd-safe
    return power.addcmul_(spec.imag, spec.imag).add_(_MAGNITUDE_EPS).sqrt_()


def mel_spectrogram(audio: torch.Tensor, cfg: AudioConfig) -> torch.Tensor:
    """`[..., samples]` -> log mel `[..., n_mels, samples // hop]` on the audio's device."""
    magnitude = magnitude_spectrogram(audio, cfg)
    mel = torch.matmul(mel_filterbank(cfg, magnitude.device, magnitude.dtype), magnitude)
    return torch.log(torch.clamp(mel, min=1e-5))
