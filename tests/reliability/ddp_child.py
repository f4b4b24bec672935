"""One rank of the DDP fault run: `torchrun --nproc_per_node 2 ddp_child.py CONFIG MAX_STEPS`.

Rank 1 alone meets a NaN training loss (batch 1), an out-of-memory error in its forward pass (batch 3)
and a NaN validation loss (its first validation batch); rank 0 meets nothing. Every rank must take the
same path: skip together, count the same reasons, and finish.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
from lightning.pytorch.callbacks import Callback

RANK = int(os.environ.get("RANK", "0"))


class RankOneFaults(Callback):
    def __init__(self):
        self.batch, self.validation_batches = 0, 0

    def on_train_start(self, trainer, pl_module) -> None:
        model, forward = pl_module.model, pl_module.model.forward

        def faulty(batch):
            if RANK == 1 and model.training and self.batch == 3:
                raise torch.OutOfMemoryError("CUDA out of memory (injected on rank 1)")
            output = forward(batch)
            nan = (model.training and self.batch == 1) or (not model.training and self.validation_batches == 0)
            if RANK == 1 and nan:
                output.losses["mel"] = output.losses["mel"] * float("nan")
            return output

        model.forward = faulty

    def on_train_batch_end(self, trainer, *args) -> None:
        self.batch += 1

    def on_validation_batch_end(self, trainer, *args) -> None:
        self.validation_batches += 1


def main() -> None:
    from voicesmith.config import load_config
    from voicesmith.training import train

    summary = train(load_config(Path(sys.argv[1])), max_steps=int(sys.argv[2]), callbacks=[RankOneFaults()])
    print(f"rank {RANK}: {summary['status']} at step {summary['global_step']}, skipped {summary['batches_skipped']}, "
          f"validation left out {summary['validation_batches_nonfinite']}", flush=True)


if __name__ == "__main__":
    main()
