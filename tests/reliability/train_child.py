"""A training process for the crash trials: `python train_child.py CONFIG MAX_STEPS [DIE_AT_WRITE]`.

It trains like `voicesmith train` does (the same `train()`), printing `trained step N` (flushed) after each
step. With DIE_AT_WRITE=k it kills itself with SIGKILL half-way through writing its k-th checkpoint,
as a power cut or OOM killer would: the bytes so far are on disk, the rename never happens.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

from lightning.pytorch.callbacks import Callback


class PrintSteps(Callback):
    def on_train_batch_end(self, trainer, *args) -> None:
        print(f"trained step {trainer.global_step}", flush=True)


def die_during_write(k: int) -> None:
    """Wrap torch.save so the k-th checkpoint write stops dead after half its bytes."""
    import io

    import torch

    save, count = torch.save, [0]

    def dying_save(obj, handle, *args, **kwargs):
        if isinstance(handle, io.BytesIO):  # feature files are serialised in memory first: not a checkpoint
            return save(obj, handle, *args, **kwargs)
        count[0] += 1
        if count[0] < k:
            return save(obj, handle, *args, **kwargs)
        buffer = io.BytesIO()
        save(obj, buffer, *args, **kwargs)
        handle.write(buffer.getvalue()[: len(buffer.getvalue()) // 2])
        handle.flush()
        os.kill(os.getpid(), signal.SIGKILL)

    torch.save = dying_save


def main() -> None:
    from voicesmith.config import load_config
    from voicesmith.training import train

    config_path, max_steps = Path(sys.argv[1]), int(sys.argv[2])
    if len(sys.argv) > 3:
        die_during_write(int(sys.argv[3]))
    train(load_config(config_path), max_steps=max_steps, callbacks=[PrintSteps()])


if __name__ == "__main__":
    main()
