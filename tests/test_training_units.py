"""Engine parts that need no training run: skip guard, loss watch, schedules, hardware checks,
checkpoint safety and resume choice, RNG state, batch halving."""

from __future__ import annotations

import json
import logging
import math
import pickle
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from voicesmith.checkpoint import CheckpointError, atomic_save, load_checkpoint
from voicesmith.config import HardwareConfig, TrainConfig
from voicesmith.errors import ConfigError, RunFailed
from voicesmith.training.guard import LossWatch, SkipGuard
from voicesmith.training.schedules import build_scheduler, cosine_restarts, exponential, lr_factor, warmup_cosine

# --- skip guard ---------------------------------------------------------------------------------------


def test_guard_counts_skips_by_reason_and_logs_every_one(tmp_path, caplog):
    guard = SkipGuard(window=20, max_fraction=0.5, max_consecutive=5, log_path=tmp_path / "skipped.jsonl")
    with caplog.at_level(logging.WARNING, logger="voicesmith"):
        guard.ok()
        guard.skip("nonfinite_loss", ["a-1", "a-2"], step=1, detail="mel=nan")
        guard.ok()
        guard.skip("out_of_memory", ["b-1"], step=2, detail="CUDA out of memory")
        guard.recover("out_of_memory_half_batch", ["c-1", "c-2"], step=3, detail="half size")
    assert guard.skipped == {"nonfinite_loss": 1, "out_of_memory": 1}
    assert guard.summary()["batches_recovered"] == {"out_of_memory_half_batch": 1}
    assert "a-1, a-2" in caplog.text and "mel=nan" in caplog.text  # first skips printed in full
    records = [json.loads(line) for line in (tmp_path / "skipped.jsonl").read_text().splitlines()]
    assert [(r["kind"], r["reason"], r["ids"]) for r in records] == [
        ("skipped", "nonfinite_loss", ["a-1", "a-2"]), ("skipped", "out_of_memory", ["b-1"]),
        ("recovered", "out_of_memory_half_batch", ["c-1", "c-2"])]


def test_guard_stops_on_consecutive_skips_naming_reason_and_ids():
    guard = SkipGuard(window=100, max_fraction=1.0, max_consecutive=3)
    for step in range(3):
        guard.skip("nonfinite_loss", [f"item-{step}"], step, "loss=nan")
    with pytest.raises(RunFailed, match=r"4 batches in a row.*nonfinite_loss: 4 \(items item-0, item-1, item-2"):
        guard.skip("nonfinite_loss", ["item-3"], 3, "loss=nan")


def test_guard_stops_when_the_window_fraction_is_exceeded():
    guard = SkipGuard(window=10, max_fraction=0.2, max_consecutive=100)  # at most 2 skips in 10 batches
    for _ in range(2):
        guard.skip("out_of_memory", ["x"], 0, "oom")
        guard.ok()
    with pytest.raises(RunFailed, match=r"3 of the last 5 batches.*max_skipped_fraction=0.2.*out_of_memory: 3"):
        guard.skip("out_of_memory", ["y"], 0, "oom")


def test_guard_forgets_skips_that_left_the_window():
    guard = SkipGuard(window=4, max_fraction=0.25, max_consecutive=100)  # one skip per 4 batches
    for _ in range(5):
        guard.skip("nonfinite_loss", ["x"], 0, "nan")
        for _ in range(3):
            guard.ok()
    assert guard.total_skipped == 5


def test_guard_state_survives_a_resume():
    guard = SkipGuard(window=10, max_fraction=1.0, max_consecutive=10)
    guard.skip("nonfinite_loss", ["a"], 0, "nan")
    restored = SkipGuard(window=10, max_fraction=1.0, max_consecutive=10)
    restored.load_state_dict(guard.state_dict())
    assert restored.skipped == {"nonfinite_loss": 1} and restored.example_ids == {"nonfinite_loss": ["a"]}


def test_loss_watch_warns_once_on_zero_and_on_a_stalled_loss():
    watch = LossWatch(patience=3)
    assert "exactly 0.0" in watch.update(0.0, step=1)
    assert watch.update(0.0, step=2) is None  # once only
    watch = LossWatch(patience=3)
    messages = [watch.update(1.5, step) for step in range(5)]
    assert messages[:3] == [None, None, None] and "not changed for 3 steps" in messages[3]
    assert messages[4] is None
    moving = LossWatch(patience=3)
    assert all(moving.update(1.0 / (step + 1), step) is None for step in range(10))


# --- schedules ----------------------------------------------------------------------------------------


def test_warmup_cosine_rises_then_falls_to_the_floor():
    factors = [warmup_cosine(step, warmup_steps=10, total_steps=110, min_ratio=0.1) for step in range(120)]
    assert factors[0] == pytest.approx(0.1) and factors[9] == pytest.approx(1.0)
    assert factors[10] == pytest.approx(1.0) and factors[60] == pytest.approx(0.55)
    assert factors[110] == pytest.approx(0.1) and factors[119] == pytest.approx(0.1)
    assert all(a >= b for a, b in zip(factors[10:], factors[11:]))


def test_cosine_restarts_double_their_period():
    factors = [cosine_restarts(step, warmup_steps=0, first_period=10, min_ratio=0.0) for step in range(70)]
    restarts = [step for step in range(1, 70) if factors[step] > factors[step - 1]]
    assert restarts == [10, 30]  # periods 10, 20, 40
    assert factors[0] == factors[10] == factors[30] == pytest.approx(1.0)


def test_exponential_decays_per_step_after_warmup():
    assert exponential(0, warmup_steps=2, decay=0.5) == pytest.approx(0.5)
    assert [exponential(step, 2, 0.5) for step in (2, 3, 4)] == pytest.approx([1.0, 0.5, 0.25])


def test_scheduler_follows_the_config_and_its_state_loads_weights_only(tmp_path):
    cfg = TrainConfig(lr_schedule="warmup_cosine", warmup_steps=2, learning_rate=1.0, min_lr_ratio=0.0)
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=cfg.learning_rate)
    scheduler = build_scheduler(optimizer, cfg, total_steps=12)
    rates = []
    for _ in range(12):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert rates[:3] == pytest.approx([0.5, 1.0, 1.0]) and rates[-1] < 0.05
    torch.save(scheduler.state_dict(), tmp_path / "sched.pt")
    assert torch.load(tmp_path / "sched.pt", weights_only=True)["last_epoch"] == 12
    for name in ("constant", "exponential", "cosine_restarts", "warmup_cosine"):
        assert 0 < lr_factor(cfg.model_copy(update={"lr_schedule": name}), 100)(50) <= 1


# --- hardware -----------------------------------------------------------------------------------------


def test_fp16_on_cpu_is_refused_with_what_to_use_instead():
    from voicesmith.training.hardware import check_precision

    with pytest.raises(ConfigError, match=r"16-mixed needs a CUDA GPU.*on CPU use 32 or bf16-mixed"):
        check_precision("cpu", "16-mixed")
    assert check_precision("cpu", "bf16-mixed") == "bf16-mixed"
    assert check_precision("cpu", "32") == "32-true"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_missing_accelerator_is_refused_not_replaced():
    from voicesmith.training.hardware import resolve_accelerator

    with pytest.raises(ConfigError, match="hardware.accelerator=cuda but this machine has no such device"):
        resolve_accelerator(HardwareConfig(accelerator="cuda"))
    assert resolve_accelerator(HardwareConfig(accelerator="auto")) in ("cpu", "mps")


def test_trainer_hardware_from_config(monkeypatch):
    from voicesmith.training.hardware import trainer_hardware

    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    kwargs = trainer_hardware(HardwareConfig(accelerator="cpu", precision="bf16-mixed", detect_anomaly=True,
                                             deterministic=True))
    assert kwargs == dict(accelerator="cpu", devices=1, num_nodes=1, strategy="auto", precision="bf16-mixed",
                          detect_anomaly=True, deterministic=True)
    assert trainer_hardware(HardwareConfig(accelerator="cpu", devices=2))["strategy"] == "ddp"
    gan = trainer_hardware(HardwareConfig(accelerator="cpu", devices=2), has_unused_parameters=True)
    assert gan["strategy"] == "ddp_find_unused_parameters_true"
    named = trainer_hardware(HardwareConfig(accelerator="cpu", strategy="ddp"), has_unused_parameters=True)
    assert named["strategy"] == "ddp_find_unused_parameters_true"  # a GAN under a plain `ddp` would crash
    assert trainer_hardware(HardwareConfig(accelerator="cpu", strategy="ddp_spawn"))["strategy"] == "ddp_spawn"
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")  # started by torchrun --nproc_per_node 4
    assert trainer_hardware(HardwareConfig(accelerator="cpu"))["devices"] == 4


def test_slurm_srun_decides_devices_and_nodes_where_the_config_keeps_its_defaults():
    from voicesmith.training.hardware import resolve_devices

    srun = {"SLURM_JOB_ID": "7", "SLURM_JOB_NAME": "voice", "SLURM_NTASKS": "8", "SLURM_NNODES": "2",
            "SLURM_NTASKS_PER_NODE": "4"}
    assert resolve_devices(HardwareConfig(), srun) == (4, 2)
    assert resolve_devices(HardwareConfig(), {**srun, "SLURM_NTASKS_PER_NODE": ""}) == (4, 2)  # 8 tasks / 2 nodes
    assert resolve_devices(HardwareConfig(), {**srun, "SLURM_NTASKS_PER_NODE": "", "SLURM_TASKS_PER_NODE": "4(x2)"}) \
        == (4, 2)
    assert resolve_devices(HardwareConfig(devices=2, num_nodes=1), srun) == (2, 2)  # the config's own value wins
    assert resolve_devices(HardwareConfig(), {**srun, "SLURM_JOB_NAME": "bash"}) == (1, 1)  # an interactive shell
    assert resolve_devices(HardwareConfig(), {}) == (1, 1)


def test_cuda_debug_switches_are_set_in_the_environment(monkeypatch):
    from voicesmith.training.hardware import apply_env_switches

    monkeypatch.delenv("CUDA_LAUNCH_BLOCKING", raising=False)
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    applied = apply_env_switches(HardwareConfig(cuda_launch_blocking=True, cuda_alloc_conf="expandable_segments:True"))
    assert applied == {"CUDA_LAUNCH_BLOCKING": "1", "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    import os

    assert os.environ["CUDA_LAUNCH_BLOCKING"] == "1"


# --- checkpoints and resume --------------------------------------------------------------------------


def _fake_checkpoint(step: int) -> dict:
    return {"state_dict": {"model.weight": torch.full((2,), float(step))}, "global_step": step, "epoch": step // 10,
            "voicesmith": {"format": 1, "model_type": "acoustic", "config": {}, "symbols": {}, "speakers": {}}}


def test_atomic_checkpoint_io_roundtrip_and_truncation_refused(tmp_path):
    from voicesmith.training.checkpointing import AtomicCheckpointIO

    io = AtomicCheckpointIO()
    path = tmp_path / "checkpoints" / "last.ckpt"
    io.save_checkpoint(_fake_checkpoint(7), path)
    assert io.load_checkpoint(path)["global_step"] == 7
    assert [p.name for p in path.parent.iterdir()] == ["last.ckpt"]  # no temporary file left behind
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="truncated or corrupt"):
        io.load_checkpoint(path)


class _Payload:
    """A pickle that would run code (touch a file) if it were ever unpickled unsafely."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def test_a_checkpoint_carrying_code_is_refused_without_running_it(tmp_path):
    from voicesmith.training.checkpointing import resume_point

    marker = tmp_path / "pwned"
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    with open(folder / "last.ckpt", "wb") as handle:
        pickle.dump({"state_dict": {}, "global_step": 5, "payload": _Payload(marker)}, handle)
    with pytest.raises(CheckpointError, match="refused"):
        load_checkpoint(folder / "last.ckpt")
    assert resume_point("auto", folder) is None
    with pytest.raises(CheckpointError):
        resume_point(str(folder / "last.ckpt"), folder)
    assert not marker.exists()


def test_resume_auto_falls_back_from_a_truncated_last_to_the_newest_step(tmp_path, caplog):
    from voicesmith.training.checkpointing import resume_point

    folder = tmp_path / "checkpoints"
    for step in (10, 20):
        atomic_save(_fake_checkpoint(step), folder / f"step-{step}.ckpt")
    atomic_save(_fake_checkpoint(25), folder / "last.ckpt")
    assert resume_point("auto", folder).global_step == 25
    (folder / "last.ckpt").write_bytes((folder / "last.ckpt").read_bytes()[:100])
    with caplog.at_level(logging.WARNING, logger="voicesmith"):
        point = resume_point("auto", folder)
    assert point.path.name == "step-20.ckpt" and point.global_step == 20
    assert "Not resuming from last.ckpt" in caplog.text and "truncated" in caplog.text
    assert point.describe(tmp_path) == "Resuming from checkpoints/step-20.ckpt at step 20 (epoch 2)."
    assert resume_point("never", folder) is None


def test_resume_auto_prefers_a_step_file_newer_than_last(tmp_path):
    from voicesmith.training.checkpointing import resume_point

    folder = tmp_path / "checkpoints"
    atomic_save(_fake_checkpoint(20), folder / "last.ckpt")
    atomic_save(_fake_checkpoint(30), folder / "step-30.ckpt")  # killed between step-30 and last
    assert resume_point("auto", folder).global_step == 30


def test_rng_state_roundtrips_through_a_weights_only_load(tmp_path):
    from voicesmith.training.rng import rng_state, set_rng_state

    torch.manual_seed(1), np.random.seed(2), random.seed(3)
    torch.save(rng_state(), tmp_path / "rng.pt")
    expected = (torch.rand(3), np.random.rand(3), random.random())
    set_rng_state(torch.load(tmp_path / "rng.pt", weights_only=True))
    assert torch.equal(torch.rand(3), expected[0])
    assert np.array_equal(np.random.rand(3), expected[1]) and random.random() == expected[2]


def test_halve_batch_keeps_the_first_half_with_its_padding_trimmed():
    from voicesmith.training.module import halve_batch

    batch = {"ids": ["a", "b", "c"], "phoneme_ids": torch.ones(3, 9, dtype=torch.long),
             "phoneme_lengths": torch.tensor([4, 5, 9]), "mels": torch.zeros(3, 2, 30),
             "mel_lengths": torch.tensor([10, 20, 30]), "audio": torch.zeros(3, 300),
             "audio_lengths": torch.tensor([100, 200, 300]), "speaker_ids": torch.zeros(3, dtype=torch.long)}
    half = halve_batch(batch)
    assert half["ids"] == ["a", "b"] and half["phoneme_ids"].shape == (2, 5)
    assert half["mels"].shape == (2, 2, 20) and half["audio"].shape == (2, 200)
    assert halve_batch({**half, "ids": ["a"]}) is None


def test_memory_pressure_levels():
    from voicesmith.training.profiling import PRESSURE_LEVELS, memory_snapshot, pressure_level

    assert [PRESSURE_LEVELS[pressure_level(x)] for x in (0.1, 0.7, 0.85, 0.95)] == \
        ["low", "moderate", "high", "critical"]
    snapshot = memory_snapshot(torch.device("cpu"))
    assert snapshot["allocated"] > 0 and 0 < snapshot["used_fraction"] < 1 and math.isfinite(snapshot["peak"])


def test_best_checkpoint_follows_train_best_metric(tmp_path):
    from lightning.pytorch.callbacks import ModelCheckpoint

    from voicesmith.config import make_config
    from voicesmith.training.checkpointing import LastCheckpoint, checkpoint_callbacks

    config = make_config("corpus", "tiny")
    steps, best, last = checkpoint_callbacks(config, tmp_path)
    assert (steps.monitor, best.monitor, best.dirpath) == ("step", "val_loss", str(tmp_path))
    assert isinstance(last, LastCheckpoint) and last.path == tmp_path / "last.ckpt"
    config.train.best_metric, config.eval.every_n_steps, config.train.keep_last_k = "cer", 50, 0
    callbacks = checkpoint_callbacks(config, tmp_path)
    monitors = [cb.monitor for cb in callbacks if isinstance(cb, ModelCheckpoint)]
    assert monitors == ["eval/cer"]
