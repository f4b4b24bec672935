"""The engine as separate processes: `voicesmith train` killed with SIGKILL then resumed, and
2-process DDP on CPU (gloo) started by torchrun."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import time
from pathlib import Path

import torch

from voicesmith.checkpoint import CheckpointError, load_checkpoint
from voicesmith.config import apply_override, load_config, preset_dict, validate_config
from voicesmith.training import train

QUICK = ["train.batch_size=4", "data.max_samples=8", "data.num_workers=0", "train.warmup_steps=0",
         "samples.every_n_steps=0", "samples.on_best=false", "logging.progress_bar=false",
         "train.val_every_n_steps=1000"]


def write_config(demo_corpus: Path, run_dir: Path, *overrides: str) -> Path:
    raw = preset_dict("tiny", str(demo_corpus))
    for item in [*QUICK, *overrides]:
        apply_override(raw, item)
    return validate_config(raw, source="test").save(run_dir / "config.yaml")


def newest_readable_step(folder: Path) -> int:
    steps = []
    for path in folder.glob("*.ckpt"):
        try:
            steps.append(load_checkpoint(path)["global_step"])
        except CheckpointError:
            pass  # a file the resume must refuse is not a candidate
    return max(steps)


def test_kill_9_mid_run_then_resume_auto_continues_from_the_last_good_checkpoint(demo_corpus, tmp_path, caplog):
    config_path = write_config(demo_corpus, tmp_path / "run", "train.checkpoint_every_n_steps=2", "train.keep_last_k=2")
    folder = tmp_path / "run" / "checkpoints"
    log_file = open(tmp_path / "train.out", "w")
    process = subprocess.Popen([sys.executable, "-m", "voicesmith.cli", "train", str(config_path), "--max-steps", "60"],
                               stdout=log_file, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 300
        while not list(folder.glob("step-4.ckpt")):
            assert process.poll() is None, (tmp_path / "train.out").read_text()
            assert time.monotonic() < deadline, "no step-4.ckpt within 5 minutes"
            time.sleep(0.2)
    finally:
        process.kill()  # SIGKILL: no handler runs, nothing is flushed
        process.wait()
        log_file.close()
    assert process.returncode == -9
    last = folder / "last.ckpt"
    last.write_bytes(last.read_bytes()[: last.stat().st_size // 3])  # and the disk lost half of last.ckpt
    expected = newest_readable_step(folder)
    assert expected >= 4

    with caplog.at_level(logging.INFO, logger="voicesmith"):
        summary = train(load_config(config_path), resume="auto", max_steps=expected + 2)
    assert "Not resuming from last.ckpt" in caplog.text and "truncated or corrupt" in caplog.text
    assert f"Resuming from checkpoints/step-{expected}.ckpt at step {expected}" in caplog.text
    assert (summary["start_step"], summary["global_step"]) == (expected, expected + 2)
    assert summary["status"] == "completed"


def test_two_process_ddp_on_cpu_under_torchrun(demo_corpus, tmp_path):
    config_path = write_config(demo_corpus, tmp_path / "run", "hardware.accelerator=cpu")
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
         "-m", "voicesmith.cli", "train", str(config_path), "--max-steps", "3"],
        capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["world_size"] == 2 and summary["global_step"] == 3
    ckpt = torch.load(tmp_path / "run" / "checkpoints" / "last.ckpt", weights_only=True)
    assert ckpt["global_step"] == 3
    assert result.stdout.count("Training completed at step 3") == 1  # rank 0 speaks, rank 1 does not
