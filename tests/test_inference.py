"""Synthesizer and `voicesmith synth`: checkpoints in, audio out, speakers by name, long texts."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

from acoustic_helpers import tiny_config
from voicesmith.audio import MEL_FLOOR, check_wav
from voicesmith.checkpoint import atomic_save, export_weights
from voicesmith.cli import main as cli_main
from voicesmith.errors import UserInputError
from voicesmith.inference import Synthesizer, synth_command
from voicesmith.models import build_model
from voicesmith.text import SymbolTable, TextFrontend

TEXT = "The quick brown fox jumps over the lazy dog."
SPEAKERS = {"alice": 0, "bob": 1, "carol": 2}


def write_voice(run_dir: Path, speakers: dict[str, int], seed: int = 0, name: str = "last.ckpt", **overrides) -> Path:
    """A run directory with a config and a checkpoint in the contract's format (untrained weights)."""
    config = tiny_config(**overrides)
    config.save(run_dir / "config.yaml")
    symbols = SymbolTable.default()
    torch.manual_seed(seed)
    model = build_model(config.model, len(symbols), config.audio.n_mels, max(len(speakers), 1), config.resolve)
    ckpt = {"state_dict": {f"model.{key}": value for key, value in model.state_dict().items()},
            "voicesmith": {"format": 1, "model_type": "acoustic", "config": config.to_dict(),
                           "symbols": symbols.to_dict(), "speakers": speakers, "global_step": 0}}
    atomic_save(ckpt, run_dir / "checkpoints" / name)
    return run_dir / "checkpoints" / name


@pytest.fixture(scope="module")
def single_voice(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("single_voice")
    write_voice(run_dir, {"": 0})
    return run_dir


@pytest.fixture(scope="module")
def multi_voice(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("multi_voice")
    write_voice(run_dir, SPEAKERS)
    return run_dir


def test_checkpoint_run_dir_and_exported_weights_speak_alike(single_voice, tmp_path):
    checkpoint = single_voice / "checkpoints" / "last.ckpt"
    exported = export_weights(torch.load(checkpoint, weights_only=True), tmp_path / "exported")
    audios = [Synthesizer.load(path).synthesize(TEXT)[0] for path in (checkpoint, single_voice, exported)]
    assert audios[0].dtype == np.float32 and audios[0].ndim == 1 and np.isfinite(audios[0]).all()
    np.testing.assert_array_equal(audios[0], audios[1])
    np.testing.assert_array_equal(audios[0], audios[2])


def test_run_dir_prefers_best_checkpoint(tmp_path):
    write_voice(tmp_path, {"": 0}, seed=0, name="last.ckpt")
    best = write_voice(tmp_path, {"": 0}, seed=1, name="best.ckpt")
    loaded = Synthesizer.load(tmp_path)
    expected = torch.load(best, weights_only=True)["state_dict"]["model.prior.weight"]
    assert torch.equal(loaded.model.prior.weight, expected)


def test_audio_matches_the_mel_and_length_scale_slows_down(single_voice):
    synthesizer = Synthesizer.load(single_voice)
    result = synthesizer.synthesize_detailed(TEXT)
    hop = synthesizer.config.audio.hop_length
    assert result.sample_rate == synthesizer.sample_rate == 22050
    assert len(result.audio) == result.mel.shape[-1] * hop
    assert result.alignment.shape == (len(result.phoneme_ids), result.mel.shape[-1])
    assert result.durations.sum() == result.mel.shape[-1] and (result.durations >= 1).all()
    slower = synthesizer.synthesize_detailed(TEXT, length_scale=1.5)
    assert slower.seconds > 1.3 * result.seconds


def test_long_text_is_split_into_sentences_joined_by_pauses(single_voice):
    synthesizer = Synthesizer.load(single_voice)
    first, second = "Every voice tells a story.", "Speak slowly, please!"
    joined = synthesizer.synthesize_detailed(f"{first} {second}")
    alone = [synthesizer.synthesize_detailed(text) for text in (first, second)]
    pause = synthesizer._pause_frames()
    assert pause == round(0.25 * 22050 / 256)
    frames = [result.mel.shape[-1] for result in alone]
    assert joined.mel.shape[-1] == frames[0] + pause + frames[1]
    np.testing.assert_allclose(joined.mel[:, :frames[0]], alone[0].mel, atol=1e-5)
    np.testing.assert_allclose(joined.mel[:, frames[0] + pause:], alone[1].mel, atol=1e-5)
    assert (joined.mel[:, frames[0]:frames[0] + pause] == pytest.approx(MEL_FLOOR))
    assert joined.alignment[:, frames[0]:frames[0] + pause].sum() == 0  # no phoneme owns the pause
    assert joined.phoneme_ids == alone[0].phoneme_ids + alone[1].phoneme_ids


def test_speaker_is_chosen_by_name_and_unknown_names_are_refused(multi_voice):
    synthesizer = Synthesizer.load(multi_voice)
    assert synthesizer.speakers == ["alice", "bob", "carol"]
    ids = TextFrontend(synthesizer.config.text, synthesizer.symbols).encode(TEXT).ids
    mels = {}
    for name, speaker_id in SPEAKERS.items():
        mels[name] = synthesizer.synthesize_detailed(TEXT, speaker=name).mel
        with torch.no_grad():
            direct = synthesizer.model.infer(torch.tensor([ids]), torch.tensor([len(ids)]), torch.tensor([speaker_id]))
        np.testing.assert_allclose(mels[name], direct["mel"][0].numpy(), atol=1e-5)
    assert mels["alice"].shape != mels["bob"].shape or not np.allclose(mels["alice"], mels["bob"])
    np.testing.assert_array_equal(synthesizer.synthesize_detailed(TEXT).mel, mels["alice"])  # default: first
    with pytest.raises(UserInputError, match=r"Unknown speaker 'dave'.*alice, bob, carol"):
        synthesizer.synthesize(TEXT, speaker="dave")


def test_single_speaker_voice_refuses_a_speaker_name(single_voice):
    with pytest.raises(UserInputError, match="single-speaker voice"):
        Synthesizer.load(single_voice).synthesize(TEXT, speaker="alice")


def test_live_model_keeps_its_mode_and_the_acoustic_voice_refuses_noise_arguments(single_voice):
    loaded = Synthesizer.load(single_voice)
    model = loaded.model.train()
    live = Synthesizer.from_model(model, loaded.config, loaded.symbols, {"": 0})
    audio, _ = live.synthesize(TEXT)
    assert model.training
    again, _ = live.synthesize(TEXT)
    np.testing.assert_array_equal(audio, again)  # eval mode while speaking: deterministic, dropout off
    with pytest.raises(UserInputError, match="noise scale and noise w"):
        live.synthesize(TEXT, noise_scale=0.9, noise_w=0.1)  # VITS's settings: refused, never silently ignored


def test_speaker_encoder_path_resolves_against_the_run_dir(tmp_path):
    class MeanEncoder(torch.nn.Module):
        def forward(self, mel: torch.Tensor) -> torch.Tensor:
            return mel.mean(-1)

    with pytest.warns(DeprecationWarning):
        torch.jit.script(MeanEncoder()).save(str(tmp_path / "encoder.pt"))
    write_voice(tmp_path, {"": 0}, speaker_encoder="encoder.pt")
    audio, _ = Synthesizer.load(tmp_path / "checkpoints" / "last.ckpt").synthesize(TEXT)
    assert len(audio) > 0
    (tmp_path / "encoder.pt").unlink()
    with pytest.raises(UserInputError, match=re.escape(str(tmp_path / "encoder.pt"))):
        Synthesizer.load(tmp_path)


def test_synth_command_writes_a_16_bit_wav_and_reports_speed(single_voice, tmp_path, capsys):
    out = tmp_path / "hello.wav"
    assert synth_command(single_voice, TEXT, out) == 0
    info = sf.info(str(out))
    assert info.subtype == "PCM_16" and info.samplerate == 22050 and info.channels == 1
    assert "NaN" not in " ".join(check_wav(out, 22050))
    printed = capsys.readouterr().out
    assert str(out) in printed and "real-time factor" in printed
    assert f"{info.frames / 22050:.2f} s" in printed


def test_cli_synth_reads_stdin_and_maps_errors_to_exit_codes(multi_voice, tmp_path, monkeypatch, capsys):
    import io

    out = tmp_path / "stdin.wav"
    monkeypatch.setattr("sys.stdin", io.StringIO("Hello there. How are you?"))
    assert cli_main(["synth", str(multi_voice), "-", "-o", str(out), "--speaker", "bob"]) == 0
    assert out.is_file()
    assert cli_main(["synth", str(multi_voice), "Hi.", "-o", str(out), "--speaker", "dave"]) == 2
    assert "dave" in capsys.readouterr().err


def test_model_paths_that_cannot_speak(tmp_path):
    with pytest.raises(UserInputError, match="ONNX voice .*voice.onnx does not exist"):
        Synthesizer.load(tmp_path / "voice.onnx")
    with pytest.raises(UserInputError, match="does not exist"):
        Synthesizer.load(tmp_path / "missing.ckpt")
    with pytest.raises(UserInputError, match="holds no voice"):
        Synthesizer.load(tmp_path)
