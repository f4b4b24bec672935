"""One recording -> the waveform training sees, and the facts validation judges it by.

Validation and preparation both call `condition_audio`, so the length validation checks
(after downmix, resampling and trimming) is exactly the length the cache will hold.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np

from voicesmith.audio import clipped_fraction, load_audio, peak, resample, to_mono, trim_silence
from voicesmith.config import AudioConfig, DataConfig


@dataclass
class AudioFacts:
    """What a recording is like before conditioning (decides the warnings and errors)."""

    sample_rate: int
    channels: int
    finite: bool = True
    peak_dbfs: float = -math.inf
    clipped_fraction: float = 0.0
    leading_silence: float = 0.0  # seconds
    trailing_silence: float = 0.0


@dataclass
class ConditionedAudio:
    """The waveform to keep (None: nothing usable) and the facts about the recording it came from."""

    audio: Optional[np.ndarray]  # float32 mono at the target rate, trimmed; None when not usable
    facts: AudioFacts
    sample_rate: int  # of `audio` (the config's)

    @property
    def seconds(self) -> float:
        return 0.0 if self.audio is None else len(self.audio) / self.sample_rate


def condition_audio(path: Path, audio_cfg: AudioConfig, data_cfg: DataConfig) -> ConditionedAudio:
    """Load, downmix, resample and trim; stops early on NaN/inf or silence (audio None).

    Raises DataError (from audio.load_audio) when the file cannot be decoded or holds no samples.
    """
    audio, sample_rate = load_audio(path)
    facts = AudioFacts(sample_rate=sample_rate, channels=audio.shape[0])
    if not np.isfinite(audio).all():
        facts.finite = False
        return ConditionedAudio(None, facts, audio_cfg.sample_rate)
    mono = to_mono(audio)
    level = peak(mono)
    facts.peak_dbfs = 20 * math.log10(level) if level > 0 else -math.inf
    facts.clipped_fraction = clipped_fraction(mono)
    if facts.peak_dbfs < data_cfg.silence_dbfs:
        return ConditionedAudio(None, facts, audio_cfg.sample_rate)
    mono = np.clip(mono, -1.0, 1.0)
    if sample_rate != audio_cfg.sample_rate:
        mono = resample(mono, sample_rate, audio_cfg.sample_rate)
    trimmed, facts.leading_silence, facts.trailing_silence = trim_silence(
        mono, audio_cfg.sample_rate, data_cfg.trim_top_db)
    kept = trimmed if data_cfg.trim_silence else mono
    return ConditionedAudio(np.ascontiguousarray(kept, dtype=np.float32), facts, audio_cfg.sample_rate)


def normalize_level(audio: np.ndarray, target_peak: Optional[float]) -> np.ndarray:
    """Scale to a fixed peak (HiFi-GAN's `normalize(audio) * 0.95`); None keeps the level."""
    level = peak(audio)
    if target_peak is None or level == 0:
        return audio
    return (audio * (target_peak / level)).astype(np.float32)
