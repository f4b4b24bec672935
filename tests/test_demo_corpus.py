"""The demo corpus is real speech, in the promised format, deterministic, and sized to its text."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import soundfile as sf

from voicesmith.demo_corpus import demo_sentences


def _rows(corpus: Path) -> list[list[str]]:
    return [line.split("|") for line in (corpus / "metadata.csv").read_text("utf-8").splitlines()]


def test_ljspeech_layout_and_audio_format(demo_corpus: Path):
    rows = _rows(demo_corpus)
    assert len(rows) == 24 and all(len(row) == 3 and row[1] == row[2] for row in rows)
    for utterance_id, text, _ in rows:
        info = sf.info(demo_corpus / "wavs" / f"{utterance_id}.wav")
        assert (info.samplerate, info.channels, info.subtype) == (22050, 1, "PCM_16")


def test_audio_is_speech_not_silence_and_lasts_as_long_as_its_text(demo_corpus: Path):
    seconds_per_char = []
    for utterance_id, text, _ in _rows(demo_corpus):
        audio, sample_rate = sf.read(demo_corpus / "wavs" / f"{utterance_id}.wav")
        frames = audio[: len(audio) // 512 * 512].reshape(-1, 512)
        voiced = (np.sqrt((frames ** 2).mean(axis=1)) > 0.01).mean()
        assert np.abs(audio).max() > 0.1 and voiced > 0.4, utterance_id
        seconds_per_char.append(len(audio) / sample_rate / len(text))
    # Speech runs at a steady pace: duration follows text length within a factor of two.
    assert 0.03 < min(seconds_per_char) and max(seconds_per_char) < 2 * min(seconds_per_char) + 0.03


def test_deterministic_and_larger_corpora_extend_smaller_ones(tmp_path: Path):
    assert demo_sentences(150)[:130] == demo_sentences(130)
    assert len(set(demo_sentences(400))) == 400
    # espeak-ng carries state from one utterance to the next, so each corpus is written by a fresh process.
    for name in ("a", "b"):
        result = subprocess.run([sys.executable, "-m", "voicesmith.cli", "demo-corpus", str(tmp_path / name),
                                 "--n", "3"], capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr
    first, second = tmp_path / "a", tmp_path / "b"
    assert (first / "metadata.csv").read_text() == (second / "metadata.csv").read_text()
    for name in ("demo-0001.wav", "demo-0003.wav"):
        assert (first / "wavs" / name).read_bytes() == (second / "wavs" / name).read_bytes()


def test_several_speakers_write_vctk_layout(multispeaker_corpus: Path):
    speakers = sorted(p.name for p in (multispeaker_corpus / "wav").iterdir())
    assert speakers == ["spk0", "spk1", "spk2"]
    for speaker in speakers:
        wavs = sorted((multispeaker_corpus / "wav" / speaker).glob("*.wav"))
        texts = sorted((multispeaker_corpus / "txt" / speaker).glob("*.txt"))
        assert len(wavs) == len(texts) == 8
        assert [w.stem for w in wavs] == [t.stem for t in texts]
