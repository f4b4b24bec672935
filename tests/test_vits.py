"""VITS: the model's promises (separate updates, no padding leak, determinism at noise 0) and real runs
on the demo corpus through the engine (losses logged, learning, bf16, resume, multi-speaker, init_from)."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from voicesmith.checkpoint import load_checkpoint
from run_helpers import write_run_config
from voicesmith.config import make_config
from voicesmith.errors import ConfigError, UserInputError
from voicesmith.inference import Synthesizer
from voicesmith.models import build_model
from voicesmith.text import SymbolTable
from voicesmith.training import train
from voicesmith.training.init_from import warm_start

LOSSES = ["mel", "kl", "duration", "adversarial", "feature_matching", "discriminator"]
# A slim VITS for tests: one period discriminator and short segments keep a step well under a second.
SLIM = ["model.discriminator_periods=[2]", "model.segment_frames=8", "train.batch_size=4", "data.max_samples=8",
        "data.num_workers=0", "samples.every_n_steps=0", "samples.on_best=false", "logging.progress_bar=false",
        "logging.log_every_n_steps=1", "train.val_every_n_steps=1000", "train.checkpoint_every_n_steps=1000"]


def slim_model(n_symbols: int = 40, n_speakers: int = 1, seed: int = 0):
    config = make_config("corpus", "tiny", "vits")
    config.model.discriminator_periods, config.model.segment_frames = [2], 8
    torch.manual_seed(seed)
    return build_model(config.model, n_symbols, config.audio.n_mels, n_speakers, None, config.audio), config


def fake_batch(n_symbols: int = 40, seed: int = 1) -> dict:
    """Two items of different lengths, padded; random audio is enough for the model's mechanics."""
    generator = torch.Generator().manual_seed(seed)
    hop, frames = 256, torch.tensor([40, 28])
    phoneme_lengths = torch.tensor([15, 9])
    ids = torch.randint(1, n_symbols, (2, 15), generator=generator)
    ids[1, 9:] = 0
    audio = torch.randn(2, 40 * hop, generator=generator) * 0.1
    audio[1, 28 * hop:] = 0
    mels = torch.randn(2, 80, 40, generator=generator)
    return {"ids": ["a", "b"], "phoneme_ids": ids, "phoneme_lengths": phoneme_lengths, "audio": audio,
            "audio_lengths": frames * hop, "mels": mels, "mel_lengths": frames,
            "speaker_ids": torch.tensor([0, 1])}


@pytest.fixture
def make_vits_run(tmp_path):
    def make(corpus: Path, *overrides: str, name: str = "run"):
        return write_run_config(tmp_path / name, corpus, [f"data.cache_dir={tmp_path / 'cache' / corpus.name}",
                                                          *SLIM, *overrides], model_type="vits")

    return make


def read_metrics(run_dir: Path) -> list[dict]:
    with open(run_dir / "logs" / "metrics.csv", newline="") as handle:
        return list(csv.DictReader(handle))


def column(rows: list[dict], name: str) -> list[float]:
    return [float(row[name]) for row in rows if row.get(name) not in (None, "")]


# --- the model ----------------------------------------------------------------------------------------


def test_each_update_reaches_only_its_own_parameters():
    model, _ = slim_model()
    batch = fake_batch()
    output = model(batch)
    sum(model.discriminator_losses(batch, output).values()).backward()
    assert all(p.grad is None for p in model.generator_parameters())
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.discriminator_parameters())
    model.zero_grad(set_to_none=True)
    sum(model.generator_losses(batch, output).values()).backward()
    assert all(p.grad is None for p in model.discriminator_parameters())
    assert all(p.requires_grad for p in model.discriminator_parameters())  # unfrozen again
    reached = {name.split(".")[0] for name, p in model.named_parameters() if p.grad is not None}
    assert {"enc_p", "enc_q", "flow", "dp", "dec"} <= reached


def test_padding_does_not_leak():
    model, _ = slim_model()
    batch = fake_batch()
    repadded = {key: value.clone() if torch.is_tensor(value) else value for key, value in batch.items()}
    repadded["phoneme_ids"][1, 9:] = 7
    repadded["audio"][1, 28 * 256:] = torch.randn(12 * 256)
    repadded["mels"][1, :, 28:] = 3.0
    results = []
    for current in (batch, repadded):
        torch.manual_seed(5)
        output = model(current)
        results.append((output, model.generator_losses(current, output)))
    (first, first_losses), (second, second_losses) = results
    assert torch.equal(first.alignment, second.alignment)
    torch.testing.assert_close(first.audio, second.audio)
    torch.testing.assert_close(first.real_audio, second.real_audio)
    for name in ("mel", "kl", "duration"):
        torch.testing.assert_close(first_losses[name], second_losses[name])


def test_spectrogram_of_an_item_does_not_depend_on_its_batch():
    from voicesmith.audio import magnitude_spectrogram
    from voicesmith.models.vits.model import linear_spectrogram

    _, config = slim_model()
    audio = torch.randn(2, 30 * 256) * 0.1
    lengths = torch.tensor([30 * 256, 20 * 256])
    batched = linear_spectrogram(audio, lengths, config.audio)
    alone = magnitude_spectrogram(audio[1, :20 * 256], config.audio)
    torch.testing.assert_close(batched[1, :, :20], alone, atol=1e-5, rtol=1e-5)


def test_inference_is_deterministic_at_noise_zero_and_returns_durations():
    model, _ = slim_model()
    model.eval()
    ids, lengths = fake_batch()["phoneme_ids"][:1], torch.tensor([15])
    with torch.no_grad():
        runs = [model.infer(ids, lengths, None, noise_scale=0.0, length_scale=1.0, noise_w=0.0) for _ in range(2)]
        noisy = model.infer(ids, lengths, None, noise_scale=0.667, length_scale=1.0, noise_w=0.8)
        slow = model.infer(ids, lengths, None, noise_scale=0.0, length_scale=2.0, noise_w=0.0)
    assert torch.equal(runs[0]["audio"], runs[1]["audio"])
    assert not torch.equal(runs[0]["audio"], noisy["audio"])
    durations = runs[0]["durations"]
    assert durations.shape == (1, 15) and torch.all(durations >= 1)
    assert runs[0]["audio"].shape[-1] == int(durations.sum()) * 256
    assert slow["audio"].shape[-1] > runs[0]["audio"].shape[-1]


def test_removing_weight_norm_keeps_the_voice():
    model, _ = slim_model()
    model.eval()
    ids, lengths = fake_batch()["phoneme_ids"][:1], torch.tensor([15])
    with torch.no_grad():
        before = model.infer(ids, lengths, None, 0.0, 1.0, 0.0)["audio"]
        model.remove_weight_norm()
        after = model.infer(ids, lengths, None, 0.0, 1.0, 0.0)["audio"]
    torch.testing.assert_close(before, after, atol=1e-5, rtol=1e-4)


def test_presets_match_pipers_sizes():
    """Piper's published (inference) sizes: x-low 5-7 M, medium 15-20 M, high 28-32 M."""
    expected = {"x-low": (5e6, 7.5e6), "medium": (15e6, 20e6), "high": (28e6, 32e6)}
    for preset, (low, high) in expected.items():
        config = make_config("corpus", preset, "vits")
        with torch.device("meta"):
            model = build_model(config.model, 256, config.audio.n_mels, 1, None, config.audio)
        assert low <= model.parameter_counts()["synthesis"] <= high, preset
        assert model.parameter_counts()["discriminator"] == 46_747_132


def test_impossible_settings_are_refused_by_name():
    config = make_config("corpus", "tiny", "vits")
    config.model.upsample_rates = [8, 8, 2]
    with pytest.raises(ConfigError, match="upsample_rates"):
        build_model(config.model, 40, 80, 1, None, config.audio)


def test_init_from_maps_symbol_rows_by_symbol(tmp_path):
    base_table = SymbolTable({"_": [0], "^": [1], "$": [2], " ": [3], "a": [4], "b": [5], "c": [6]}, "characters")
    new_table = SymbolTable({"_": [0], "^": [1], "$": [2], " ": [3], "c": [4], "x": [5], "a": [6], "b": [7]},
                            "characters")
    base, config = slim_model(n_symbols=len(base_table), seed=1)
    ckpt = {"state_dict": {f"model.{k}": v for k, v in base.state_dict().items()},
            "voicesmith": {"model_type": "vits", "symbols": base_table.to_dict(), "speakers": {},
                           "config": config.to_dict()}}
    model, _ = slim_model(n_symbols=len(new_table), seed=2)
    fresh_x = model.enc_p.emb.weight[5].detach().clone()
    report = warm_start(model, ckpt, new_table, {}, "vits", tmp_path / "base.ckpt")
    rows, base_rows = model.enc_p.emb.weight.detach(), base.enc_p.emb.weight.detach()
    for symbol, row in {"a": 6, "b": 7, "c": 4, "_": 0, "^": 1}.items():
        assert torch.equal(rows[row], base_rows[base_table.phoneme_id_map[symbol][0]]), symbol
    assert torch.equal(rows[5], fresh_x)  # the new symbol keeps its fresh row
    assert report.symbols_new == ["x"] and report.symbols_shared == 7
    assert torch.equal(model.dec.conv_pre.weight, base.dec.conv_pre.weight)
    assert "x" in report.describe(tmp_path / "base.ckpt")

    bigger = make_config("corpus", "tiny", "vits")
    bigger.model.hidden_channels = 96
    other = build_model(bigger.model, len(new_table), 80, 1, None, bigger.audio)
    with pytest.raises(ConfigError, match=r"enc_p\.encoder.*base voice \[64"):
        warm_start(other, ckpt, new_table, {}, "vits", tmp_path / "base.ckpt")


# --- real runs through the engine --------------------------------------------------------------------


def test_training_logs_every_loss_raw_and_weighted_and_lowers_mel_and_kl(demo_corpus, make_vits_run):
    config = make_vits_run(demo_corpus, "train.learning_rate=1e-3")
    summary = train(config, max_steps=24)
    assert summary["status"] == "completed" and summary["global_step"] == 24
    assert set(LOSSES) <= set(summary["last_losses"])
    rows = read_metrics(config.run_dir)
    weights = {"mel": 45.0}
    for name in LOSSES:
        raw, weighted = column(rows, f"loss/{name}"), column(rows, f"loss_weighted/{name}")
        assert len(raw) == 24 and all(math.isfinite(v) for v in raw + weighted), name
        assert weighted[-1] == pytest.approx(raw[-1] * weights.get(name, 1.0), rel=1e-4), name
    for name in ("mel", "kl"):
        values = column(rows, f"loss/{name}")
        assert sum(values[-6:]) / 6 < 0.85 * sum(values[:6]) / 6, (name, values)
    lrs = column(rows, "lr")
    assert lrs[-1] < lrs[0]  # the exponential decay really steps


def test_resume_restores_both_optimizers_and_schedulers(demo_corpus, make_vits_run):
    config = make_vits_run(demo_corpus, "train.checkpoint_every_n_steps=2")
    train(config, max_steps=2)
    summary = train(config, resume="auto", max_steps=3)
    assert summary["start_step"] == 2 and summary["global_step"] == 3
    ckpt = load_checkpoint(config.run_dir / "checkpoints" / "last.ckpt")
    assert len(ckpt["optimizer_states"]) == 2 and len(ckpt["lr_schedulers"]) == 2
    for optimizer in ckpt["optimizer_states"]:
        steps = {float(state["step"]) for state in optimizer["state"].values()}
        assert steps == {3.0}  # 2 before the interruption + 1 after: the Adam moments came back
    for scheduler in ckpt["lr_schedulers"]:
        assert scheduler["last_epoch"] == 3
        assert scheduler["_last_lr"][0] == pytest.approx(config.train.learning_rate * config.train.lr_decay ** 3)


def test_warm_up_holds_the_frozen_parts_then_trains_them(demo_corpus, make_vits_run):
    """train.freeze / freeze_steps (set by import-voice for ONNX voices): the held parts keep their weights
    bit for bit while the others learn, and train once the warm-up is over."""
    from lightning.pytorch.callbacks import Callback

    names = ("enc_p.emb.weight", "dp.pre.weight", "enc_q.pre.weight")

    class Snapshots(Callback):
        def __init__(self):
            self.weights: list[dict[str, torch.Tensor]] = []

        def snapshot(self, pl_module) -> None:
            state = pl_module.model.state_dict()
            self.weights.append({name: state[name].clone() for name in names})

        def on_train_start(self, trainer, pl_module) -> None:
            self.snapshot(pl_module)

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            self.snapshot(pl_module)

    config = make_vits_run(demo_corpus, "train.freeze=[enc_p, dp.pre]", "train.freeze_steps=2")
    snapshots = Snapshots()
    summary = train(config, max_steps=3, callbacks=[snapshots])
    assert summary["status"] == "completed"
    start, _, after_two, after_three = snapshots.weights
    for name in names[:2]:
        assert torch.equal(start[name], after_two[name]), name  # held through steps 1 and 2 ...
        assert not torch.equal(after_two[name], after_three[name]), name  # ... and trained at step 3
    assert not torch.equal(start[names[2]], after_two[names[2]])  # the fresh parts learn during the warm-up


def test_a_freeze_prefix_that_matches_nothing_is_refused_by_name(demo_corpus, make_vits_run):
    config = make_vits_run(demo_corpus, "train.freeze=[encoder]", "train.freeze_steps=5")
    with pytest.raises(ConfigError, match="'encoder'.*enc_p"):
        train(config, max_steps=1)


def test_bf16_mixed_training_on_the_cpu_keeps_every_loss_finite(demo_corpus, make_vits_run):
    config = make_vits_run(demo_corpus, "hardware.precision=bf16-mixed", "hardware.accelerator=cpu")
    summary = train(config, max_steps=3)
    assert summary["status"] == "completed" and not summary["batches_skipped"]
    rows = read_metrics(config.run_dir)
    assert all(math.isfinite(v) for name in LOSSES for v in column(rows, f"loss/{name}"))


def test_synthesis_from_a_run_deterministic_and_multi_speaker(multispeaker_corpus, make_vits_run, tmp_path):
    config = make_vits_run(multispeaker_corpus, "data.max_samples=12")
    train(config, max_steps=2)
    synth = Synthesizer.load(config.run_dir)
    assert len(synth.speakers) == 3 and synth.model.n_speakers == 3
    first, second = synth.speakers[:2]
    quiet = dict(noise_scale=0.0, noise_w=0.0)
    a1, rate = synth.synthesize("A short test.", first, **quiet)
    a2, _ = synth.synthesize("A short test.", first, **quiet)
    b, _ = synth.synthesize("A short test.", second, **quiet)
    assert rate == config.audio.sample_rate and a1.dtype.name == "float32"
    assert np.array_equal(a1, a2)
    assert a1.shape != b.shape or not np.array_equal(a1, b)
    detailed = synth.synthesize_detailed("A short test.", second, **quiet)
    ids = torch.tensor([detailed.phoneme_ids])
    with torch.no_grad():
        expected = synth.model.infer(ids, torch.tensor([ids.shape[1]]), torch.tensor([synth.speaker_id(second)]),
                                     0.0, 1.0, 0.0)["audio"][0, 0].numpy()
    np.testing.assert_allclose(detailed.audio, expected, atol=1e-5)
    with pytest.raises(UserInputError, match="Unknown speaker"):
        synth.synthesize("Hi.", "nobody")
    with pytest.raises(UserInputError, match="noise"):
        synth.synthesize("Hi.", first, noise_scale=-1)


@pytest.mark.slow
def test_two_process_ddp_vits_on_cpu_under_torchrun(demo_corpus, make_vits_run):
    """Both updates under DDP: the discriminator is frozen during the generator's pass and idle networks
    are tolerated (find_unused_parameters), so ranks stay in step."""
    import subprocess
    import sys

    config = make_vits_run(demo_corpus, "hardware.accelerator=cpu", "train.batch_size=2")
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
         "-m", "voicesmith.cli", "train", str(config.path), "--max-steps", "3"],
        capture_output=True, text=True, timeout=1200)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    summary = json.loads((config.run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["world_size"] == 2 and summary["global_step"] == 3
    assert set(LOSSES) <= set(summary["last_losses"])
