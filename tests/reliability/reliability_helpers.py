"""What the reliability checks share: the quick settings and readers of a run's outputs."""

from __future__ import annotations

import json
from pathlib import Path

QUICK = ["train.batch_size=4", "data.max_samples=8", "data.num_workers=0", "train.warmup_steps=0",
         "samples.every_n_steps=0", "samples.on_best=false", "logging.progress_bar=false",
         "logging.log_every_n_steps=1", "train.val_every_n_steps=1000", "train.checkpoint_every_n_steps=1000",
         "hardware.accelerator=cpu", "hardware.deterministic=true"]


def read_summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())
