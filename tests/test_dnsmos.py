"""DNSMOS naturalness: it ranks clean recordings above damaged copies, equals the `speechmos` package's
own scorer, and reaches `voicesmith eval`'s JSON and table (for every language) and training's
best-checkpoint choice."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from test_evaluate import tiny_config

from voicesmith import dnsmos
from voicesmith.audio import load_audio, mel_spectrogram, to_mono
from voicesmith.checkpoint import atomic_save
from voicesmith.config import AudioConfig
from voicesmith.data.formats import read_corpus
from voicesmith.errors import ConfigError, UserInputError
from voicesmith.evaluate import eval_command
from voicesmith.models import build_model
from voicesmith.models.griffin_lim import griffin_lim
from voicesmith.text import SymbolTable
from voicesmith.training import train
from voicesmith.training.checkpointing import best_metric, checkpoint_callbacks
from voicesmith.training.eval_callback import eval_callbacks

SCORE_KEYS = {f"{side}dnsmos_{name}" for side in ("", "reference_") for name in dnsmos.SCORES}


def recording(path: Path) -> tuple[np.ndarray, int]:
    audio, sample_rate = load_audio(path)
    return to_mono(audio), sample_rate


def one_window_recordings(corpus: Path, n: int) -> list[tuple[np.ndarray, int]]:
    """The first n recordings that DNSMOS scores in a single window (keeps the model calls few)."""
    clips = [recording(item.audio_path) for item in read_corpus(corpus).items]
    return [clip for clip in clips if len(dnsmos.model_windows(dnsmos.prepare(*clip))) == 1][:n]


def mean_scores(scores: list[dnsmos.DnsmosScores]) -> dict[str, float]:
    return {name: float(np.mean([getattr(score, name) for score in scores])) for name in dnsmos.SCORES}


# --- what the score says --------------------------------------------------------------------------


def test_clean_recordings_score_clearly_above_noisy_and_griffin_lim_copies(demo_corpus):
    clips = one_window_recordings(demo_corpus, 3)
    assert len(clips) == 3
    rng = np.random.default_rng(0)
    noisy = [(audio + rng.normal(0, np.sqrt(np.mean(audio ** 2) / 10), audio.size).astype(np.float32), rate)
             for audio, rate in clips]  # white noise at 10 dB SNR
    cfg = AudioConfig()
    # one Griffin-Lim iteration from the mel: the phase is barely recovered, the buzz of a poor vocoder
    resynthesised = [(griffin_lim(mel_spectrogram(torch.from_numpy(audio)[None], cfg)[0], cfg, n_iters=1).numpy(),
                      rate) for audio, rate in clips]
    scorer = dnsmos.scorer()
    clean, noise, buzz = (mean_scores(scorer.score_many(group)) for group in (clips, noisy, resynthesised))
    assert clean["ovrl"] > noise["ovrl"] + 0.3 and clean["p808"] > noise["p808"] + 0.4, (clean, noise)
    assert clean["bak"] > noise["bak"] + 1.0  # the background is what noise spoils
    assert clean["ovrl"] > buzz["ovrl"] + 0.2 and clean["sig"] > buzz["sig"] + 0.2, (clean, buzz)
    assert clean["p808"] > buzz["p808"] + 0.15
    for scores in (clean, noise, buzz):
        assert all(1.0 <= value <= 5.0 for value in scores.values()), scores


def test_windows_follow_the_definition():
    second = np.arange(dnsmos.SAMPLE_RATE, dtype=np.float32) / dnsmos.SAMPLE_RATE
    windows = dnsmos.model_windows(second)  # 1 s, doubled to 16 s: 16 - 9 = 7 windows, 1 s apart
    assert windows.shape == (7, dnsmos.WINDOW_SAMPLES)
    assert np.array_equal(windows[0][:second.size], second) and np.array_equal(windows[1][:second.size], second)
    assert dnsmos.model_windows(np.ones(int(9.5 * dnsmos.SAMPLE_RATE), np.float32)).shape[0] == 1
    assert dnsmos.model_windows(np.ones(12 * dnsmos.SAMPLE_RATE + 5, np.float32)).shape[0] == 3
    features = dnsmos.p808_features(windows[:2])
    assert features.shape == (2, 900, 120) and features.dtype == np.float32
    assert features.max() == pytest.approx(1.0) and features.min() >= -1.0  # (0 dB + 40) / 40, floor -80 dB


def test_bad_audio_is_refused_and_silence_still_scores():
    with pytest.raises(ValueError, match="empty"):
        dnsmos.dnsmos(np.zeros(0, np.float32), 16000)
    with pytest.raises(ValueError, match="NaN"):
        dnsmos.dnsmos(np.full(16000, np.nan, np.float32), 16000)
    with pytest.raises(ValueError, match="mono"):
        dnsmos.dnsmos(np.zeros((2, 16000), np.float32), 16000)
    silence = dnsmos.dnsmos(np.zeros(22050 * 5 // 2, np.float32), 22050)  # 2.5 s: doubled twice, one window
    assert all(np.isfinite(value) for value in silence.as_dict().values())


def test_missing_models_are_a_clear_install_hint(monkeypatch):
    monkeypatch.setattr(dnsmos, "MODELS_PACKAGE", "speechmos_not_installed_here")
    with pytest.raises(UserInputError, match=r"voicesmith\[eval\]"):
        dnsmos.check_available()


def test_the_module_imports_neither_torch_nor_onnxruntime():
    code = ("import sys, voicesmith.dnsmos; "
            "print(sorted(m for m in ('torch', 'onnxruntime', 'librosa', 'speechmos.dnsmos') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and result.stdout.strip() == "[]", result.stderr


# --- the same numbers as the package's own scorer --------------------------------------------------


def reference_scores(audio: np.ndarray, model_type: str = "dnsmos") -> dict[str, float]:
    """speechmos.dnsmos.run (librosa features, its loops), on 16 kHz audio."""
    from speechmos import dnsmos as package

    result = package.run(audio, dnsmos.SAMPLE_RATE, model_type=model_type)
    return {name: float(result[f"{name}_mos"]) for name in dnsmos.SCORES}


def test_scores_equal_the_package_scorer(demo_corpus):
    short = dnsmos.prepare(*one_window_recordings(demo_corpus, 1)[0])  # repeated up to one window
    items = read_corpus(demo_corpus).items
    tiled = next(clip for clip in (dnsmos.prepare(*recording(item.audio_path)) for item in items)
                 if len(dnsmos.model_windows(clip)) == 2)  # repeated to 11-12 s: two windows
    scorer = dnsmos.scorer()
    for clip in (short, tiled):
        ours, theirs = scorer.score(clip, dnsmos.SAMPLE_RATE).as_dict(""), reference_scores(clip)
        for name in ("ovrl", "sig", "bak"):  # waveform in, so only float rounding may differ
            assert ours[name] == pytest.approx(theirs[name], abs=1e-3), (name, ours, theirs)
        assert ours["p808"] == pytest.approx(theirs["p808"], abs=0.01), (ours, theirs)  # through our mel
    personalized = dnsmos.scorer(personalized=True).score(short, dnsmos.SAMPLE_RATE).as_dict("")
    theirs = reference_scores(short, "dnsmos_personalized")
    assert all(personalized[name] == pytest.approx(theirs[name], abs=1e-3) for name in dnsmos.SCORES)


@pytest.mark.slow
def test_long_clips_differ_from_the_package_only_by_the_windows_it_skips(demo_corpus):
    """Over 17 s the package loses windows 8-24 to float rounding of their bounds; over the windows it
    keeps, our per-window scores average to its numbers."""
    clips = [dnsmos.prepare(*recording(item.audio_path)) for item in read_corpus(demo_corpus).items]
    long_clip = np.concatenate(clips)[:int(17.5 * dnsmos.SAMPLE_RATE)]
    windows = dnsmos.model_windows(long_clip)
    assert len(windows) == 8
    kept = [index for index in range(len(windows))
            if int((index + 9.01) * dnsmos.SAMPLE_RATE) - index * dnsmos.SAMPLE_RATE == dnsmos.WINDOW_SAMPLES]
    assert kept == list(range(7))
    per_window = dnsmos.scorer().score_windows(windows[kept])
    theirs = reference_scores(long_clip)
    for column, name in enumerate(dnsmos.SCORES):
        assert per_window[:, column].mean() == pytest.approx(theirs[name], abs=0.01), name


# --- `voicesmith eval` and training ------------------------------------------------------------------


def untrained_voice(folder: Path, corpus: Path, language: str) -> tuple[Path, Path]:
    """A checkpoint of a freshly initialised tiny voice and a one-item filelist of the corpus."""
    config = tiny_config(corpus, f"text.language={language}")
    symbols = SymbolTable.default()
    model = build_model(config.model, len(symbols), config.audio.n_mels)
    ckpt = {"state_dict": {f"model.{key}": value for key, value in model.state_dict().items()},
            "voicesmith": {"format": 1, "model_type": "acoustic", "config": config.to_dict(),
                           "symbols": symbols.to_dict(), "speakers": {}, "global_step": 0}}
    atomic_save(ckpt, folder / "voice.ckpt")
    item = read_corpus(corpus).items[0]
    (folder / "list.txt").write_text(f"{item.audio_path}|{item.text}\n")
    return folder / "voice.ckpt", folder / "list.txt"


@pytest.mark.slow
def test_training_keeps_the_best_checkpoint_by_cer_and_dnsmos(demo_corpus, tmp_path):
    """Two training steps, evaluated at step 2, best.ckpt chosen by CER and DNSMOS together."""
    config = tiny_config(demo_corpus, "train.best_metric=cer_dnsmos", "train.checkpoint_every_n_steps=2")
    config.save(tmp_path / "config.yaml")
    summary = train(config, max_steps=2)
    assert summary["status"] == "completed"
    latest = summary["eval"]["latest"]
    assert {"dnsmos_ovrl", "dnsmos_sig", "dnsmos_bak", "dnsmos_p808"} <= set(latest)
    assert latest["dnsmos_shortfall"] == pytest.approx((5 - latest["dnsmos_ovrl"]) / 4)
    assert latest["cer_dnsmos"] == pytest.approx((latest["cer"] + latest["dnsmos_shortfall"]) / 2)
    assert summary["best_metric"] == "eval/cer_dnsmos"
    assert summary["best_score"] == pytest.approx(latest["cer_dnsmos"])
    assert (tmp_path / "checkpoints" / "best.ckpt").is_file()


def test_eval_json_and_table_carry_naturalness_also_for_a_language_without_recogniser(demo_corpus, tmp_path,
                                                                                      capsys):
    """(English voices get the same keys: tests/test_evaluate.py checks them on a trained run.)"""
    voice, items = untrained_voice(tmp_path, demo_corpus, "de")
    assert eval_command(voice, items, 1, tmp_path / "de.json") == 0
    table = capsys.readouterr().out
    result = json.loads((tmp_path / "de.json").read_text())
    assert result["cer"] is None and result["recognizer"] is None
    item = result["items"][0]
    assert SCORE_KEYS <= set(result) and SCORE_KEYS <= set(item)
    for key in SCORE_KEYS:
        assert 1.0 <= result[key] <= 5.0 and result[key] == pytest.approx(item[key]), key  # one item: mean = item
    recorded = read_corpus(demo_corpus).items[0]
    assert item["reference_dnsmos_ovrl"] == pytest.approx(dnsmos.dnsmos(*recording(recorded.audio_path)).ovrl)
    # an untrained voice is buzz through Griffin-Lim: the recording must sound better
    assert item["reference_dnsmos_ovrl"] > item["dnsmos_ovrl"] + 0.3
    assert "ref OVRL" in table and "P.808" in table and "DNSMOS" in table


def test_best_metric_dnsmos_is_served_for_any_language_and_refused_without_evaluation(demo_corpus, tmp_path):
    config = tiny_config(demo_corpus, "train.best_metric=dnsmos", "text.language=de", "eval.every_n_steps=5")
    assert len(eval_callbacks(config)) == 1 and best_metric(config) == "eval/dnsmos_shortfall"
    best = [callback for callback in checkpoint_callbacks(config, tmp_path)
            if getattr(callback, "monitor", None) == best_metric(config)]
    assert len(best) == 1 and best[0].mode == "min" and best[0]._every_n_train_steps == 5
    with pytest.raises(ConfigError, match="eval.every_n_steps"):
        eval_callbacks(tiny_config(demo_corpus, "train.best_metric=dnsmos", "eval.every_n_steps=0"))
    with pytest.raises(ConfigError, match="recogniser"):
        eval_callbacks(tiny_config(demo_corpus, "train.best_metric=cer_dnsmos", "text.language=de"))
