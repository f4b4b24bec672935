"""Audio io, fix-ups, levels and the HiFi-GAN-convention mel spectrogram."""

from __future__ import annotations

import math

import numpy as np
import pytest
import soundfile as sf
import torch

from voicesmith.audio import (
    MEL_FLOOR, SILENCE_DBFS, check_wav, clipped_fraction, istft, load_audio, mel_filterbank, mel_spectrogram,
    peak, resample, rms_dbfs, stft, to_mono, trim_silence, write_wav,
)
from voicesmith.config import AudioConfig
from voicesmith.errors import DataError

CONFIGS = [
    AudioConfig(),
    AudioConfig(sample_rate=16000, n_fft=512, win_length=400, hop_length=160, n_mels=64, f_min=50, f_max=None),
    AudioConfig(sample_rate=44100, n_fft=2048, win_length=2048, hop_length=512, n_mels=128, f_max=None),
]


def sine(freq: float, seconds: float, sample_rate: int, amplitude: float = 0.5) -> np.ndarray:
    t = np.arange(int(seconds * sample_rate)) / sample_rate
    return (amplitude * np.sin(2 * np.pi * freq * t)).astype(np.float32)


# ------------------------------------------------------------------ references written independently


def reference_filterbank(cfg: AudioConfig) -> np.ndarray:
    """Slaney's mel filterbank the long way: one triangle at a time, unit area in Hz."""
    def hz_to_mel(f):
        return f / (200 / 3) if f < 1000 else 15 + 27 * math.log(f / 1000) / math.log(6.4)

    def mel_to_hz(m):
        return m * (200 / 3) if m < 15 else 1000 * 6.4 ** ((m - 15) / 27)

    f_max = cfg.f_max or cfg.sample_rate / 2
    low, high = hz_to_mel(cfg.f_min), hz_to_mel(f_max)
    edges = [mel_to_hz(low + (high - low) * i / (cfg.n_mels + 1)) for i in range(cfg.n_mels + 2)]
    bins = [k * cfg.sample_rate / cfg.n_fft for k in range(cfg.n_fft // 2 + 1)]
    weights = np.zeros((cfg.n_mels, len(bins)))
    for m in range(cfg.n_mels):
        left, centre, right = edges[m], edges[m + 1], edges[m + 2]
        for k, f in enumerate(bins):
            if left < f <= centre:
                weights[m, k] = (f - left) / (centre - left)
            elif centre < f < right:
                weights[m, k] = (right - f) / (right - centre)
        weights[m] *= 2 / (right - left)
    return weights


def reference_log_mel(audio: np.ndarray, cfg: AudioConfig) -> np.ndarray:
    """numpy: reflect pad (n_fft-hop)/2, periodic Hann frames, |rfft|, slaney mel, log floor 1e-5."""
    pad = (cfg.n_fft - cfg.hop_length) // 2
    padded = np.pad(audio.astype(np.float64), (pad, cfg.n_fft - cfg.hop_length - pad), mode="reflect")
    window = np.zeros(cfg.n_fft)
    offset = (cfg.n_fft - cfg.win_length) // 2
    window[offset:offset + cfg.win_length] = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(cfg.win_length) / cfg.win_length)
    n_frames = (len(padded) - cfg.n_fft) // cfg.hop_length + 1
    frames = np.stack([padded[i * cfg.hop_length:i * cfg.hop_length + cfg.n_fft] * window for i in range(n_frames)])
    spectrum = np.fft.rfft(frames, axis=1).T
    magnitude = np.sqrt(np.abs(spectrum) ** 2 + 1e-9)
    return np.log(np.maximum(reference_filterbank(cfg) @ magnitude, 1e-5))


# ------------------------------------------------------------------ mel


@pytest.mark.parametrize("cfg", CONFIGS, ids=["22k", "16k", "44k"])
def test_filterbank_matches_reference(cfg):
    weights = mel_filterbank(cfg).double().numpy()
    assert weights.shape == (cfg.n_mels, cfg.n_fft // 2 + 1)
    np.testing.assert_allclose(weights, reference_filterbank(cfg), atol=1e-7)


@pytest.mark.parametrize("cfg", CONFIGS, ids=["22k", "16k", "44k"])
def test_filterbank_matches_librosa(cfg):
    librosa = pytest.importorskip("librosa")
    expected = librosa.filters.mel(sr=cfg.sample_rate, n_fft=cfg.n_fft, n_mels=cfg.n_mels, fmin=cfg.f_min,
                                   fmax=cfg.f_max, htk=False, norm="slaney")
    np.testing.assert_allclose(mel_filterbank(cfg).numpy(), expected, atol=1e-6)


def test_filterbank_is_cached_per_device_and_dtype():
    cfg = AudioConfig()
    assert mel_filterbank(cfg) is mel_filterbank(AudioConfig())
    assert mel_filterbank(cfg, dtype=torch.float64).dtype == torch.float64
    assert mel_filterbank(cfg, dtype=torch.float64) is not mel_filterbank(cfg)


@pytest.mark.parametrize("cfg", CONFIGS[:2], ids=["22k", "16k"])
def test_mel_matches_numpy_reference(cfg):
    audio = sine(440, 0.5, cfg.sample_rate) + 0.05 * np.random.default_rng(0).standard_normal(
        int(0.5 * cfg.sample_rate)).astype(np.float32)
    mel = mel_spectrogram(torch.from_numpy(audio), cfg)
    np.testing.assert_allclose(mel.numpy(), reference_log_mel(audio, cfg), atol=2e-4)


@pytest.mark.parametrize("n_samples", [400, 5000, 256 * 40, 256 * 40 + 255, 22050])
def test_mel_has_samples_over_hop_frames(n_samples):
    cfg = AudioConfig()
    audio = torch.randn(n_samples) * 0.1
    assert mel_spectrogram(audio, cfg).shape == (cfg.n_mels, n_samples // cfg.hop_length)


def test_mel_is_batched_over_leading_dimensions():
    cfg = AudioConfig()
    audio = torch.randn(2, 3, 6000) * 0.1
    batched = mel_spectrogram(audio, cfg)
    assert batched.shape == (2, 3, cfg.n_mels, 6000 // cfg.hop_length)
    torch.testing.assert_close(batched[1, 2], mel_spectrogram(audio[1, 2], cfg), atol=1e-5, rtol=0)


def test_mel_of_silence_is_the_floor_and_half_precision_is_accepted():
    cfg = AudioConfig()
    assert torch.all(mel_spectrogram(torch.zeros(4096), cfg) == MEL_FLOOR)
    half = mel_spectrogram(torch.randn(4096).half() * 0.1, cfg)
    assert half.dtype == torch.float32 and torch.isfinite(half).all()
    assert mel_spectrogram(torch.randn(4096, dtype=torch.float64), cfg).dtype == torch.float64


def test_mel_is_differentiable():
    """Mel losses on generated audio (vocoder, VITS) need exact gradients through the in-place magnitude."""
    cfg = AudioConfig(sample_rate=8000, n_fft=64, win_length=64, hop_length=16, n_mels=8, f_max=None)
    audio = (torch.randn(2, 160, dtype=torch.float64) * 0.1).requires_grad_()
    assert torch.autograd.gradcheck(lambda x: mel_spectrogram(x, cfg), (audio,), fast_mode=True)


def test_mel_refuses_too_short_audio():
    with pytest.raises(ValueError, match="samples"):
        mel_spectrogram(torch.zeros(100), AudioConfig())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_mel_on_cuda_matches_cpu():
    cfg = AudioConfig()
    audio = torch.randn(2, 8000) * 0.1
    on_gpu = mel_spectrogram(audio.cuda(), cfg)
    assert on_gpu.device.type == "cuda"
    torch.testing.assert_close(on_gpu.cpu(), mel_spectrogram(audio, cfg), atol=1e-3, rtol=1e-3)


@pytest.mark.parametrize("cfg", CONFIGS[:2], ids=["22k", "16k"])
def test_istft_inverts_stft(cfg):
    audio = torch.randn(2, cfg.hop_length * 30) * 0.1
    torch.testing.assert_close(istft(stft(audio, cfg), cfg), audio, atol=1e-5, rtol=0)


# ------------------------------------------------------------------ files


def test_load_audio_keeps_channels_and_rate(tmp_path):
    stereo = np.stack([sine(440, 0.3, 44100), sine(880, 0.3, 44100, 0.25)], axis=1)
    path = tmp_path / "stereo.wav"
    sf.write(path, stereo, 44100, subtype="FLOAT")
    audio, sample_rate = load_audio(path)
    assert sample_rate == 44100 and audio.dtype == np.float32 and audio.shape == (2, stereo.shape[0])
    np.testing.assert_allclose(to_mono(audio), stereo.mean(axis=1), atol=1e-7)


def test_load_audio_reports_broken_and_empty_files(tmp_path):
    broken = tmp_path / "broken.wav"
    broken.write_bytes(b"RIFF not really a wave file")
    with pytest.raises(DataError, match="broken.wav"):
        load_audio(broken)
    empty = tmp_path / "empty.wav"
    sf.write(empty, np.zeros(0, dtype=np.float32), 22050)
    with pytest.raises(DataError, match="empty.wav"):
        load_audio(empty)
    with pytest.raises(DataError, match="missing.wav"):
        load_audio(tmp_path / "missing.wav")


def test_resample_keeps_the_pitch():
    tone = sine(1000, 1.0, 44100)
    resampled = resample(tone, 44100, 22050)
    assert abs(len(resampled) - 22050) <= 1 and resampled.dtype == np.float32
    spectrum = np.abs(np.fft.rfft(resampled))
    assert abs(np.argmax(spectrum) * 22050 / len(resampled) - 1000) < 2
    assert resample(tone, 44100, 44100) is tone


def test_write_wav_is_atomic_16_bit_and_clips(tmp_path):
    path = tmp_path / "out" / "speech.wav"
    audio = np.concatenate([sine(220, 0.5, 22050), [1.7, -3.0]]).astype(np.float32)
    write_wav(path, audio, 22050)
    assert sorted(p.name for p in path.parent.iterdir()) == ["speech.wav"]
    assert check_wav(path, 22050) == []
    data, _ = sf.read(path, dtype="float32")
    np.testing.assert_allclose(data[:-2], audio[:-2], atol=1 / 32768 + 1e-7)
    assert data[-2] == pytest.approx(1.0, abs=1e-4) and data[-1] == pytest.approx(-1.0, abs=1e-4)
    with pytest.raises(ValueError, match="NaN"):
        write_wav(tmp_path / "nan.wav", np.array([0.0, np.nan], dtype=np.float32), 22050)
    assert not (tmp_path / "nan.wav").exists() and not list(tmp_path.glob(".*tmp"))


def test_check_wav_names_each_problem(tmp_path):
    tone = sine(220, 0.5, 22050)
    cases = {
        "rate.wav": (tone, 16000, "PCM_16", "sample rate is 16000 Hz"),
        "stereo.wav": (np.stack([tone, tone], axis=1), 22050, "PCM_16", "2 channels"),
        "float.wav": (tone, 22050, "FLOAT", "16-bit"),
        "silent.wav": (np.zeros(22050, dtype=np.float32), 22050, "PCM_16", "silent"),
        "nan.wav": (np.where(np.arange(len(tone)) == 5, np.nan, tone).astype(np.float32), 22050, "FLOAT", "NaN"),
    }
    for name, (audio, sample_rate, subtype, expected) in cases.items():
        sf.write(tmp_path / name, audio, sample_rate, subtype=subtype)
        problems = check_wav(tmp_path / name, 22050)
        assert any(expected in problem and name in problem for problem in problems), (name, problems)
    (tmp_path / "junk.wav").write_bytes(b"junk")
    assert "cannot be read" in check_wav(tmp_path / "junk.wav", 22050)[0]


def test_check_wav_accepts_the_demo_corpus(demo_corpus):
    wav = sorted((demo_corpus / "wavs").glob("*.wav"))[0]
    assert check_wav(wav, 22050) == []


# ------------------------------------------------------------------ fix-ups and levels


def test_trim_silence_cuts_only_the_quiet_ends():
    sample_rate = 22050
    noise = 1e-5 * np.random.default_rng(1).standard_normal(int(1.8 * sample_rate)).astype(np.float32)
    audio = noise.copy()
    tone_start, tone_end = int(0.5 * sample_rate), int(1.5 * sample_rate)
    audio[tone_start:tone_end] += sine(300, 1.0, sample_rate)
    trimmed, leading, trailing = trim_silence(audio, sample_rate, top_db=40)
    assert 0.44 <= leading <= 0.5 and 0.24 <= trailing <= 0.3
    assert len(trimmed) == len(audio) - round((leading + trailing) * sample_rate)
    assert peak(trimmed) == pytest.approx(peak(audio))  # all of the tone is kept
    kept, lead_none, trail_none = trim_silence(sine(300, 1.0, sample_rate), sample_rate, top_db=40)
    assert len(kept) == sample_rate and lead_none == trail_none == 0.0
    empty, leading, _ = trim_silence(np.zeros(sample_rate, dtype=np.float32), sample_rate, top_db=40)
    assert len(empty) == 0 and leading == pytest.approx(1.0)


def test_level_statistics():
    tone = sine(440, 1.0, 22050, amplitude=0.5)
    assert peak(tone) == pytest.approx(0.5, abs=1e-3)
    assert rms_dbfs(tone) == pytest.approx(20 * math.log10(0.5 / math.sqrt(2)), abs=0.05)
    assert rms_dbfs(np.zeros(100)) == SILENCE_DBFS
    assert clipped_fraction(tone) == 0.0
    clipped = np.clip(4 * tone, -1, 1)
    expected = np.mean(np.abs(4 * tone) >= 0.999)
    assert clipped_fraction(clipped) == pytest.approx(expected) and expected > 0.5
