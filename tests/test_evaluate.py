"""Evaluation: the recogniser on real speech, silence and noise; MCD and DTW; `voicesmith eval` on a
trained run and on its checkpoint; a voice without a recogniser; evaluation during training."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
from lightning.pytorch.callbacks import ModelCheckpoint

from voicesmith.asr import error_rates, normalize_for_asr, transcribe
from voicesmith.audio import load_audio, to_mono
from voicesmith.checkpoint import atomic_save, load_checkpoint
from voicesmith.config import apply_override, preset_dict, validate_config
from voicesmith.data.formats import read_corpus
from voicesmith.errors import ConfigError, UserInputError
from voicesmith.evaluate import eval_command
from voicesmith.mcd import dtw_mean_distance, mel_cepstral_distortion
from voicesmith.models import build_model
from voicesmith.text import SymbolTable
from voicesmith.training import train
from voicesmith.training.eval_callback import CER_METRIC, EvalCallback, eval_callbacks

DNSMOS_KEYS = {f"{side}dnsmos_{name}" for side in ("", "reference_") for name in ("ovrl", "sig", "bak", "p808")}
EVAL_KEYS = {"cer", "wer", "reference_cer", "reference_wer", "mcd", "duration_ratio", "rtf", "n_items", "items",
             *DNSMOS_KEYS}
ITEM_KEYS = {"id", "text", "transcript", "reference_transcript", "cer", "wer", "reference_cer", "reference_wer",
             "mcd", "duration_ratio", "rtf", *DNSMOS_KEYS}
TIMINGS = {"rtf", "synthesis_seconds"}  # wall-clock: the only numbers two evaluations may disagree on


def recording(path: Path) -> tuple[np.ndarray, int]:
    audio, sample_rate = load_audio(path)
    return to_mono(audio), sample_rate


# --- the recogniser and the text it is scored on -----------------------------------------------------


def test_recogniser_understands_demo_recordings_and_not_silence_or_noise(demo_corpus):
    items = read_corpus(demo_corpus).items[:5]
    transcripts = [transcribe(*recording(item.audio_path)) for item in items]
    cer, wer = error_rates([item.text for item in items], transcripts)
    assert cer < 0.5 and wer < 0.8, list(zip([item.text for item in items], transcripts))
    # each utterance is decoded on its own: the same audio gives the same words after other audio
    assert transcribe(*recording(items[0].audio_path)) == transcripts[0]

    sample_rate = 22050
    silence = np.zeros(3 * sample_rate, dtype=np.float32)
    noise = np.random.default_rng(1).normal(0, 0.1, 3 * sample_rate).astype(np.float32)
    for audio in (silence, noise):
        assert error_rates(items[0].text, transcribe(audio, sample_rate))[0] > 0.8


def test_texts_are_normalised_alike_and_empty_transcripts_score_one():
    assert normalize_for_asr("Dr. Smith paid $5, didn't he?") == "doctor smith paid five dollars didnt he"
    assert normalize_for_asr("  HELLO -- World...  ") == "hello world"
    assert error_rates("The cat sat.", "the CAT sat") == (0.0, 0.0)
    assert error_rates("the cat sat", "") == (1.0, 1.0)
    # over several items: all edits / all reference characters (11 + 5), words (3 + 2)
    assert error_rates(["the cat sat", "a dog"], ["the bat sat", ""]) == pytest.approx((6 / 16, 3 / 5))
    with pytest.raises(ValueError, match="reference"):
        error_rates("?!", "hello")


# --- distortion --------------------------------------------------------------------------------------


def test_mcd_is_zero_for_identical_audio_and_grows_with_noise(demo_corpus):
    audio, sample_rate = recording(demo_corpus / "wavs" / "demo-0001.wav")
    assert mel_cepstral_distortion(audio, audio, sample_rate) == 0.0
    rng = np.random.default_rng(0)
    scores = [mel_cepstral_distortion(audio, audio + rng.normal(0, level, audio.size).astype(np.float32),
                                      sample_rate) for level in (0.002, 0.02, 0.2)]
    assert 0 < scores[0] < scores[1] < scores[2]
    assert mel_cepstral_distortion(audio, 0.5 * audio, sample_rate) < 0.2 * scores[0]  # c0 (level) left out
    other, _ = recording(demo_corpus / "wavs" / "demo-0002.wav")
    assert mel_cepstral_distortion(audio, other, sample_rate) > scores[0]


def test_dtw_pairs_frames_of_a_time_stretched_copy_at_no_cost():
    frames = np.random.default_rng(0).normal(size=(40, 24))
    assert dtw_mean_distance(frames, np.repeat(frames, 3, axis=0)) == 0.0
    shifted = frames + 1.0  # every pair is sqrt(24) apart, whatever the path
    assert dtw_mean_distance(frames, shifted) == pytest.approx(np.sqrt(24))


# --- a trained run: `voicesmith eval` and evaluation during training ----------------------------------

QUICK = ["train.batch_size=4", "data.num_workers=0", "train.warmup_steps=0", "samples.every_n_steps=0",
         "samples.on_best=false", "logging.progress_bar=false", "logging.log_every_n_steps=5",
         "train.val_every_n_steps=1000", "train.checkpoint_every_n_steps=1000", "data.val_fraction=0.25",
         "eval.every_n_steps=2", "eval.limit=1"]


def tiny_config(dataset: Path, *overrides: str):
    raw = preset_dict("tiny", str(dataset))
    for item in [*QUICK, *overrides]:
        apply_override(raw, item)
    return validate_config(raw, source="test")


@pytest.fixture(scope="module")
def trained_run(demo_corpus, tmp_path_factory):
    """Two training steps with evaluation at step 2 and best-by-CER checkpoints (run dir, callbacks)."""
    config = tiny_config(demo_corpus)
    run_dir = tmp_path_factory.mktemp("eval_run")
    config.save(run_dir / "config.yaml")
    callbacks = eval_callbacks(config)
    by_cer = ModelCheckpoint(dirpath=run_dir / "by_cer", filename="best", monitor=CER_METRIC, mode="min",
                             every_n_train_steps=2, save_top_k=1, enable_version_counter=False)
    summary = train(config, max_steps=2, callbacks=[*callbacks, by_cer])
    assert summary["status"] == "completed"
    return run_dir, callbacks, by_cer, summary


def test_eval_callback_logs_the_scores_and_cer_can_choose_the_best_checkpoint(trained_run):
    run_dir, callbacks, by_cer, summary = trained_run
    assert len(callbacks) == 1 and isinstance(callbacks[0], EvalCallback)
    latest = callbacks[0].latest
    assert set(latest) == {"cer", "wer", "mcd", "duration_ratio", "rtf", "dnsmos_ovrl", "dnsmos_sig", "dnsmos_bak",
                           "dnsmos_p808", "dnsmos_shortfall", "cer_dnsmos"}
    assert callbacks[0].latest_cer == latest["cer"]
    with open(run_dir / "logs" / "metrics.csv", newline="") as handle:
        logged = [row for row in csv.DictReader(handle) if row.get("eval/cer")]
    assert [int(row["step"]) for row in logged] == [2]
    assert float(logged[0]["eval/mcd"]) == pytest.approx(latest["mcd"])
    assert by_cer.best_model_score is not None and float(by_cer.best_model_score) == pytest.approx(latest["cer"])
    assert (run_dir / "by_cer" / "best.ckpt").is_file()
    assert summary["eval"]["evaluations"] == 1 and summary["eval"]["failed"] == 0


def test_eval_on_the_run_and_on_its_checkpoint_give_the_same_numbers(trained_run, tmp_path, capsys):
    run_dir = trained_run[0]
    assert eval_command(run_dir, None, 1, tmp_path / "run.json") == 0
    table = capsys.readouterr().out
    assert eval_command(run_dir / "checkpoints" / "last.ckpt", None, 1, tmp_path / "ckpt.json") == 0
    by_run, by_ckpt = (json.loads((tmp_path / name).read_text()) for name in ("run.json", "ckpt.json"))

    assert EVAL_KEYS <= set(by_run) and by_run["n_items"] == len(by_run["items"]) == 1
    assert all(ITEM_KEYS <= set(item) for item in by_run["items"])
    for key in ("cer", "wer", "reference_cer", "reference_wer", "mcd", "duration_ratio", "rtf"):
        assert isinstance(by_run[key], float) and by_run[key] >= 0, key
    assert all(isinstance(by_run[key], float) and 1 <= by_run[key] <= 5 for key in DNSMOS_KEYS)
    assert by_run["reference_cer"] < 0.5  # the recogniser understands the recordings of these texts
    assert all(item["id"] in table for item in by_run["items"]) and "MCD" in table

    def without_timings(result: dict) -> dict:
        drop = TIMINGS | {"model", "audio_seconds"}  # audio_seconds: same, but rtf's denominator
        return {key: ([without_timings(item) for item in value] if key == "items" else value)
                for key, value in result.items() if key not in drop}

    assert without_timings(by_run) == without_timings(by_ckpt)
    # the validation split of the run, as training made it, not the first items of the corpus
    assert by_run["items_from"] == "validation split"


def test_a_voice_without_recogniser_gets_distortion_and_speed_with_a_note(demo_corpus, tmp_path, capsys):
    config = tiny_config(demo_corpus, "text.language=de")
    symbols = SymbolTable.default()
    model = build_model(config.model, len(symbols), config.audio.n_mels)
    ckpt = {"state_dict": {f"model.{key}": value for key, value in model.state_dict().items()},
            "voicesmith": {"format": 1, "model_type": "acoustic", "config": config.to_dict(),
                           "symbols": symbols.to_dict(), "speakers": {}, "global_step": 0}}
    atomic_save(ckpt, tmp_path / "voice.ckpt")
    filelist = tmp_path / "list.txt"
    items = read_corpus(demo_corpus).items[:2]
    filelist.write_text("".join(f"{item.audio_path}|{item.text}\n" for item in items))

    assert eval_command(tmp_path / "voice.ckpt", filelist, 1, tmp_path / "de.json") == 0
    result = json.loads((tmp_path / "de.json").read_text())
    assert result["cer"] is None and result["reference_wer"] is None and result["items"][0]["transcript"] is None
    assert result["mcd"] > 0 and result["rtf"] > 0 and result["n_items"] == 1
    assert any("'de'" in note for note in result["notes"]) and "note:" in capsys.readouterr().out


def test_bad_eval_inputs_are_refused_clearly(trained_run, demo_corpus, tmp_path):
    run_dir = trained_run[0]
    with pytest.raises(UserInputError, match="--limit"):
        eval_command(run_dir, None, 0, None)
    with pytest.raises(UserInputError, match="does not exist"):
        eval_command(run_dir, tmp_path / "missing", 1, None)
    ckpt = load_checkpoint(run_dir / "checkpoints" / "last.ckpt")  # away from its run, data named relatively
    ckpt["voicesmith"]["config"]["data"]["dataset"] = "corpus"
    lone = tmp_path / "elsewhere" / "voice.ckpt"
    atomic_save(ckpt, lone)
    with pytest.raises(UserInputError, match="DATASET"):
        eval_command(lone, None, 1, None)
    with pytest.raises(ConfigError, match="eval.every_n_steps"):
        eval_callbacks(tiny_config(demo_corpus, "train.best_metric=cer", "eval.every_n_steps=0"))
    with pytest.raises(ConfigError, match="recogniser"):
        eval_callbacks(tiny_config(demo_corpus, "train.best_metric=cer", "text.language=de"))


def test_training_adds_evaluation_when_the_config_asks_for_it(demo_corpus):
    from voicesmith.training.run import with_evaluation

    assert with_evaluation(tiny_config(demo_corpus, "eval.every_n_steps=0"), []) == []
    config = tiny_config(demo_corpus, "eval.every_n_steps=5")
    assert [type(callback) for callback in with_evaluation(config, [])] == [EvalCallback]
    own = EvalCallback(config)
    assert with_evaluation(config, [own]) == [own]  # never evaluated twice
