"""DDP (2 processes, gloo, torchrun): one rank meets a NaN training loss, an out-of-memory error and a NaN
validation loss; every rank takes the same path, nothing hangs (bounded by a timeout), and the run
skips with the reasons counted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

CHILD = Path(__file__).with_name("ddp_child.py")


@pytest.mark.slow
def test_faults_on_one_rank_take_the_same_path_on_every_rank(make_run):
    config = make_run("train.batch_size=2", "data.val_fraction=0.25", "train.val_every_n_steps=4",
                      "data.max_samples=16", own_cache=True)
    result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                             str(CHILD), str(config.path), "6"], capture_output=True, text=True, timeout=540)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    lines = sorted(line for line in result.stdout.splitlines() if line.startswith("rank "))
    assert len(lines) == 2 and lines[0][len("rank 0"):] == lines[1][len("rank 1"):], lines  # the same on both
    summary = json.loads((config.run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["global_step"] == 6 and summary["world_size"] == 2
    assert summary["batches_skipped"] == {"nonfinite_loss": 1, "out_of_memory": 1}
    assert summary["validation_batches_nonfinite"] >= 1
    records = [json.loads(line) for line in (config.run_dir / "logs" / "skipped_batches.jsonl").read_text().splitlines()]
    assert "another rank's loss was not finite" in records[0]["detail"] or "mel=nan" in records[0]["detail"]
    assert "every rank skipped the batch" in records[1]["detail"]
