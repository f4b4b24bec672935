"""Griffin-Lim turns the mel of real (espeak-ng) speech back into audio with that mel."""

from __future__ import annotations

import pytest
import torch

from voicesmith.audio import load_audio, mel_spectrogram
from voicesmith.config import AudioConfig
from voicesmith.models.griffin_lim import griffin_lim, spectral_convergence


@pytest.fixture(scope="module")
def speech_mel(demo_corpus) -> torch.Tensor:
    wav = sorted((demo_corpus / "wavs").glob("*.wav"))[0]
    audio, _ = load_audio(wav)
    return mel_spectrogram(torch.from_numpy(audio[0]), AudioConfig())[:, :160]  # ~1.9 s keeps the test quick


def test_more_iterations_give_audio_closer_to_the_mel(speech_mel):
    cfg = AudioConfig()
    mel_errors, convergences = [], []
    for n_iters in (0, 4, 16):
        audio = griffin_lim(speech_mel, cfg, n_iters=n_iters)
        assert audio.shape == (speech_mel.shape[-1] * cfg.hop_length,)
        assert torch.isfinite(audio).all()
        mel_errors.append((mel_spectrogram(audio, cfg) - speech_mel).abs().mean().item())
        convergences.append(spectral_convergence(audio, speech_mel, cfg))
    assert convergences[2] < convergences[1] < convergences[0]
    assert mel_errors[2] < mel_errors[1] < mel_errors[0]
    assert mel_errors[2] < 0.5 * mel_errors[0]
    assert convergences[2] < 0.25


def test_batch_matches_single_and_is_deterministic(speech_mel):
    cfg = AudioConfig()
    short = speech_mel[:, :60]
    batch = griffin_lim(torch.stack([short, short.flip(-1)]), cfg, n_iters=3)
    assert batch.shape == (2, 60 * cfg.hop_length)
    torch.testing.assert_close(batch[0], griffin_lim(short, cfg, n_iters=3), atol=1e-5, rtol=0)
    assert torch.equal(griffin_lim(short, cfg, n_iters=3), griffin_lim(short, cfg, n_iters=3))


def test_momentum_out_of_range_is_refused(speech_mel):
    with pytest.raises(ValueError, match="momentum"):
        griffin_lim(speech_mel, AudioConfig(), n_iters=1, momentum=1.5)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_runs_on_cuda(speech_mel):
    audio = griffin_lim(speech_mel.cuda(), AudioConfig(), n_iters=8)
    assert audio.device.type == "cuda" and torch.isfinite(audio).all()
    torch.testing.assert_close(audio.cpu(), griffin_lim(speech_mel, AudioConfig(), n_iters=8), atol=1e-2, rtol=0)
