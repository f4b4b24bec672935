"""The engine on the real tiny acoustic model and the demo corpus: learning, faults, interrupts,
resume, samples from the live weights, the GAN (manual two-optimizer) path, spawn workers."""

from __future__ import annotations

import csv
import json
import logging
import os
import signal
from pathlib import Path

import pytest
import torch
from lightning.pytorch.callbacks import Callback
from torch import nn

from run_helpers import write_run_config
from voicesmith.config import VoiceConfig
from voicesmith.errors import ConfigError, DataError, RunFailed
from voicesmith.training import train

QUICK = ["train.batch_size=4", "data.max_samples=8", "data.num_workers=0", "train.warmup_steps=0",
         "samples.every_n_steps=0", "samples.on_best=false", "logging.progress_bar=false",
         "logging.log_every_n_steps=1", "train.val_every_n_steps=1000", "train.checkpoint_every_n_steps=1000"]


@pytest.fixture(scope="module")
def shared_cache(demo_corpus, tmp_path_factory) -> Path:
    """One feature cache for every run of this module (prepared by the first run)."""
    return tmp_path_factory.mktemp("training_cache") / "cache"


@pytest.fixture
def make_run(demo_corpus, shared_cache, tmp_path):
    def make(*overrides: str, name: str = "run") -> VoiceConfig:
        return write_run_config(tmp_path / name, demo_corpus, [f"data.cache_dir={shared_cache}", *QUICK, *overrides])

    return make


def read_metrics(run_dir: Path) -> list[dict]:
    with open(run_dir / "logs" / "metrics.csv", newline="") as handle:
        return list(csv.DictReader(handle))


def read_summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


# --- learning and the run directory -------------------------------------------------------------------


def test_training_lowers_the_loss_and_fills_the_run_directory(make_run):
    config = make_run("train.checkpoint_every_n_steps=8", "train.keep_last_k=1", "train.val_every_n_steps=8")
    summary = train(config, max_steps=16)
    run_dir = config.run_dir
    assert summary == read_summary(run_dir)
    assert summary["status"] == "completed" and summary["reason"] == "reached max_steps=16"
    assert summary["global_step"] == 16 and summary["start_step"] == 0
    assert summary["items_used"] == 9 and summary["items_train"] == 8 and summary["items_excluded"] == 0
    assert summary["batches_skipped"] == {} and set(summary["last_losses"]) == {"mel", "prior", "duration", "total"}

    rows = [row for row in read_metrics(run_dir) if row.get("loss/total")]
    totals = [float(row["loss/total"]) for row in rows]
    assert len(totals) == 16
    assert sum(totals[-4:]) / 4 < 0.9 * sum(totals[:4]) / 4  # it learns
    assert float(rows[0]["loss_weighted/mel"]) == pytest.approx(float(rows[0]["loss/mel"]))
    assert any(row.get("val_loss") for row in read_metrics(run_dir))
    assert list((run_dir / "logs").glob("events.out.tfevents.*"))
    assert (run_dir / "data_report.json").is_file()

    checkpoints = run_dir / "checkpoints"
    assert sorted(p.name for p in checkpoints.iterdir()) == ["best.ckpt", "last.ckpt", "step-16.ckpt"]
    ckpt = torch.load(checkpoints / "last.ckpt", weights_only=True)  # no pickled code anywhere
    assert ckpt["global_step"] == 16 and ckpt["voicesmith"]["global_step"] == 16
    assert ckpt["voicesmith"]["model_type"] == "acoustic" and ckpt["voicesmith"]["symbols"]
    assert ckpt["voicesmith"]["config"]["train"]["batch_size"] == 4
    assert len(ckpt["optimizer_states"]) == 1 and ckpt["lr_schedulers"][0]["last_epoch"] == 16
    assert "torch" in ckpt["voicesmith_train"]["rng"]


# --- faults: skipped, counted, bounded ----------------------------------------------------------------


class FaultInjector(Callback):
    """Wraps the live model's forward: per training batch index, NaN losses or raised errors."""

    def __init__(self, plan: dict[int, str]):
        self.plan, self.fault, self.ids = plan, None, {}
        self.batches = 0

    def on_train_start(self, trainer, pl_module) -> None:
        model = pl_module.model
        forward = model.forward

        def faulty(batch):
            if not model.training or self.fault is None:
                return forward(batch)
            if self.fault == "nan":
                output = forward(batch)
                output.losses["mel"] = output.losses["mel"] * float("nan")
                return output
            if self.fault == "oom" or (self.fault == "oom_full_size" and len(batch["ids"]) > 2):
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (injected)")
            if self.fault == "error":
                raise ValueError("injected failure")
            return forward(batch)

        model.forward = faulty

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.fault = self.plan.get(self.batches, self.plan.get("all"))
        self.ids[self.batches] = list(batch["ids"])
        self.batches += 1


def test_nan_and_out_of_memory_batches_are_skipped_counted_and_reported(make_run):
    config = make_run()
    faults = FaultInjector({1: "nan", 3: "oom_full_size", 5: "oom"})
    summary = train(config, max_steps=6, callbacks=[faults])
    assert summary["status"] == "completed" and summary["global_step"] == 6  # skipped batches are not steps
    assert faults.batches == 8
    assert summary["batches_skipped"] == {"nonfinite_loss": 1, "out_of_memory": 1}
    assert summary["batches_recovered"] == {"out_of_memory_half_batch": 1}
    assert summary["skipped_example_ids"]["nonfinite_loss"] == faults.ids[1]
    lines = (config.run_dir / "logs" / "skipped_batches.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert [(r["reason"], r["ids"]) for r in records] == [("nonfinite_loss", faults.ids[1]),
                                                         ("out_of_memory_half_batch", faults.ids[3]),
                                                         ("out_of_memory", faults.ids[5])]
    assert "mel=nan" in records[0]["detail"]


def test_too_many_skipped_batches_stop_the_run_with_the_reasons(make_run):
    config = make_run("train.max_consecutive_skipped=2")
    with pytest.raises(RunFailed, match=r"3 batches in a row were skipped.*nonfinite_loss: 3 \(items demo-"):
        train(config, max_steps=6, callbacks=[FaultInjector({"all": "nan"})])
    summary = read_summary(config.run_dir)
    assert summary["status"] == "failed" and "nonfinite_loss" in summary["reason"]
    assert summary["batches_skipped"] == {"nonfinite_loss": 3} and summary["global_step"] == 0

    config = make_run("train.skip_window=10", "train.max_skipped_fraction=0.2", name="fraction")
    with pytest.raises(RunFailed, match="max_skipped_fraction=0.2"):
        train(config, max_steps=20, callbacks=[FaultInjector({0: "oom", 2: "oom", 4: "oom"})])
    assert read_summary(config.run_dir)["batches_skipped"] == {"out_of_memory": 3}


def test_a_non_recoverable_error_stops_at_once_naming_the_batch(make_run):
    config = make_run()
    faults = FaultInjector({2: "error"})
    with pytest.raises(ValueError, match="injected failure"):
        train(config, max_steps=6, callbacks=[faults])
    summary = read_summary(config.run_dir)
    assert summary["status"] == "failed" and summary["global_step"] == 2
    assert "ValueError: injected failure" in summary["reason"] and ", ".join(faults.ids[2]) in summary["reason"]
    assert summary["checkpoint"] is None  # a half-done step is not saved as last.ckpt


# --- interrupts and resume --------------------------------------------------------------------------


class StopAt(Callback):
    """Ctrl-C as the next batch starts, or a SIGTERM delivered as a batch ends, at a given step."""

    def __init__(self, step: int, how: str):
        self.step, self.how = step, how

    def on_train_batch_start(self, trainer, *args) -> None:
        if self.how == "ctrl-c" and trainer.global_step == self.step:
            raise KeyboardInterrupt

    def on_train_batch_end(self, trainer, *args) -> None:
        if self.how == "sigterm" and trainer.global_step == self.step:
            os.kill(os.getpid(), signal.SIGTERM)


def test_ctrl_c_and_sigterm_save_last_and_resume_continues_exactly(make_run, caplog):
    config = make_run()
    handler = signal.getsignal(signal.SIGINT)
    summary = train(config, max_steps=8, callbacks=[StopAt(2, "ctrl-c")])
    assert summary["status"] == "interrupted" and summary["global_step"] == 2
    assert signal.getsignal(signal.SIGINT) is handler  # Ctrl-C works again for the caller
    assert summary["checkpoint"] == "checkpoints/last.ckpt"
    assert torch.load(config.run_dir / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 2

    with caplog.at_level(logging.INFO, logger="voicesmith"):
        summary = train(config, max_steps=8, callbacks=[StopAt(4, "sigterm")])
    assert "Resuming from checkpoints/last.ckpt at step 2 (epoch 1)." in caplog.text
    assert summary["status"] == "interrupted" and summary["reason"] == "SIGTERM"
    assert summary["start_step"] == 2 and summary["global_step"] == 4

    summary = train(config, max_steps=5)
    assert summary["status"] == "completed" and (summary["start_step"], summary["global_step"]) == (4, 5)
    steps = [int(row["step"]) for row in read_metrics(config.run_dir) if row.get("loss/total")]
    assert steps[:2] == [1, 2] and steps[-1] == 5 and steps == sorted(set(steps))  # kept across resumes


# --- samples ------------------------------------------------------------------------------------------


def test_samples_come_from_the_weights_being_trained(make_run):
    from voicesmith.audio import check_wav, write_wav
    from voicesmith.inference import Synthesizer

    config = make_run("samples.every_n_steps=2", "samples.texts=[Hello there., ' ']", "samples.n_references=1",
                      "samples.on_best=true", "train.val_every_n_steps=4", "train.checkpoint_every_n_steps=2",
                      "samples.griffin_lim_iters=4")
    summary = train(config, max_steps=4)
    samples = config.run_dir / "samples"
    # rounds: step 2, step 4, best (validation at step 4); the blank text fails each time, training goes on
    assert summary["status"] == "completed"
    assert summary["samples"]["written"] == 6 and summary["samples"]["failed"] == 3
    reference_id = next(p.stem for p in (samples / "step_2").glob("*_reference.wav")).removesuffix("_reference")
    for step in (2, 4):
        names = sorted(p.name for p in (samples / f"step_{step}").iterdir())
        assert names == sorted([f"{reference_id}.png", f"{reference_id}.wav", f"{reference_id}_reference.wav",
                                "sample-01.png", "sample-01.wav"])
        assert check_wav(samples / f"step_{step}" / "sample-01.wav", config.audio.sample_rate) == []
    assert (samples / "best" / "sample-01.wav").is_file()
    step_2 = (samples / "step_2" / "sample-01.wav").read_bytes()
    step_4 = (samples / "step_4" / "sample-01.wav").read_bytes()
    assert step_2 != step_4  # the weights moved between the two
    synth = Synthesizer.load(config.run_dir / "checkpoints" / "step-4.ckpt", griffin_lim_iters=4)
    audio, rate = synth.synthesize("Hello there.")
    write_wav(config.run_dir / "reloaded.wav", audio, rate)
    assert (config.run_dir / "reloaded.wav").read_bytes() == step_4  # exactly the live weights of step 4


# --- the GAN path (manual optimisation with two optimizers) ----------------------------------------------


class TinyMelGan(nn.Module):
    """A real (if tiny) GAN on the batch's mels: a generator that rebuilds mels from noisy ones,
    a convolutional discriminator; least-squares adversarial losses plus an L1 mel loss."""

    is_gan = True

    def __init__(self, n_mels: int = 80):
        super().__init__()
        self.generator = nn.Sequential(nn.Conv1d(n_mels, 32, 3, padding=1), nn.GELU(),
                                       nn.Conv1d(32, n_mels, 3, padding=1))
        self.discriminator = nn.Sequential(nn.Conv1d(n_mels, 16, 5, stride=2), nn.GELU(), nn.Conv1d(16, 1, 3))

    def generator_parameters(self):
        return self.generator.parameters()

    def discriminator_parameters(self):
        return self.discriminator.parameters()

    def loss_names(self) -> list[str]:
        return ["disc", "adv", "mel"]

    def forward(self, batch: dict) -> torch.Tensor:
        real = batch["mels"] / 5.0
        return self.generator(real + 0.3 * torch.randn_like(real))

    def discriminator_losses(self, batch: dict, fake: torch.Tensor) -> dict[str, torch.Tensor]:
        real = batch["mels"] / 5.0
        return {"disc": ((self.discriminator(real) - 1) ** 2).mean() + (self.discriminator(fake.detach()) ** 2).mean()}

    def generator_losses(self, batch: dict, fake: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"adv": ((self.discriminator(fake) - 1) ** 2).mean(), "mel": (fake - batch["mels"] / 5.0).abs().mean()}


class NormAfterClip(Callback):
    def __init__(self):
        self.norms = []

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        self.norms.append(float(torch.nn.utils.get_total_norm(grads)))


def test_gan_models_train_with_two_optimizers_clipped_one_step_per_pair(make_run):
    config = make_run("train.grad_clip_norm=0.01", "train.learning_rate=0.001")
    norms = NormAfterClip()
    summary = train(config, max_steps=4, model=TinyMelGan(), callbacks=[norms])
    assert summary["status"] == "completed" and summary["global_step"] == 4
    assert set(summary["last_losses"]) == {"disc", "adv", "mel", "total"}
    assert len(norms.norms) == 8 and max(norms.norms) <= 0.01 * 1.001  # both updates of each step, clipped
    ckpt = torch.load(config.run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    assert len(ckpt["optimizer_states"]) == 2 and ckpt["global_step"] == 4
    assert all(state["state"] for state in ckpt["optimizer_states"])  # both networks were updated


def test_the_time_budget_stops_cleanly_with_a_checkpoint(make_run):
    config = make_run("train.max_minutes=0.0001")
    summary = train(config, max_steps=50, model=TinyMelGan())
    assert summary["status"] == "completed" and summary["reason"].startswith("time budget reached")
    assert summary["global_step"] == 1 and summary["checkpoint"] == "checkpoints/last.ckpt"


# --- refusals -----------------------------------------------------------------------------------------


def test_fp16_on_cpu_is_refused_and_still_leaves_a_summary(make_run):
    config = make_run("hardware.accelerator=cpu", "hardware.precision=16-mixed")
    with pytest.raises(ConfigError, match="16-mixed needs a CUDA GPU"):
        train(config, max_steps=2)
    summary = read_summary(config.run_dir)
    assert summary["status"] == "failed" and "16-mixed" in summary["reason"]


def test_no_usable_item_is_refused_with_a_data_report(tmp_path):
    import numpy as np
    import soundfile as sf

    from voicesmith.config import make_config

    corpus = tmp_path / "corpus"
    (corpus / "wavs").mkdir(parents=True)
    (corpus / "metadata.csv").write_text("short-1|Hi.|Hi.\nshort-2|Oh.|Oh.\n")
    for name in ("short-1", "short-2"):
        sf.write(corpus / "wavs" / f"{name}.wav", np.zeros(1000, dtype=np.int16), 22050, subtype="PCM_16")
    config = make_config(str(corpus), "tiny")
    config.save(tmp_path / "run" / "config.yaml")
    with pytest.raises(DataError, match="No usable item"):
        train(config, max_steps=2)
    summary = read_summary(config.run_dir)
    assert summary["status"] == "failed" and summary["items_used"] == 0 and summary["items_excluded"] == 2
    assert json.loads((config.run_dir / "data_report.json").read_text())["items_usable"] == 0


# --- worker processes started with spawn (Windows, macOS) -------------------------------------------------


def test_training_with_two_spawned_workers(make_run):
    import multiprocessing

    config = make_run("data.num_workers=2")
    previous = multiprocessing.get_start_method(allow_none=True)
    multiprocessing.set_start_method("spawn", force=True)
    try:
        summary = train(config, max_steps=3)
    finally:
        multiprocessing.set_start_method(previous, force=True)
    assert summary["status"] == "completed" and summary["global_step"] == 3
