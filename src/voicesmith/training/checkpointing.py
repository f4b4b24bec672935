"""Checkpoints: atomic writes, safe reads, `last.ckpt` / `best.ckpt` / `step-<N>.ckpt`, and resume.

Lightning writes every checkpoint through `AtomicCheckpointIO` (temporary file + fsync + rename, so
a crash while saving never leaves a broken file) and reads through `voicesmith.checkpoint`'s safe
loader (`weights_only=True`; a corrupt, foreign or code-carrying file is refused, never unpickled).
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import lightning as L
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning.pytorch.callbacks import Checkpoint, ModelCheckpoint
from lightning.pytorch.utilities.exceptions import SIGTERMException

from voicesmith.checkpoint import BEST, LAST, CheckpointError, atomic_save, load_checkpoint
from voicesmith.config import VoiceConfig
from voicesmith.errors import RunFailed

log = logging.getLogger(__name__)

STEP_PATTERN = re.compile(r"^step-(\d+)\.ckpt$")
SAVE_ON = (KeyboardInterrupt, SIGTERMException, RunFailed)  # stops after which the weights are consistent


class AtomicCheckpointIO(TorchCheckpointIO):
    """Atomic saves and safe loads; the checkpoint already read to choose the resume point is handed
    over once instead of being read (optimizer state and all) a second time."""

    def __init__(self, resume: Optional["ResumePoint"] = None):
        super().__init__()
        self._resume = resume

    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options: Optional[Any] = None) -> None:
        atomic_save(checkpoint, Path(path))

    def load_checkpoint(self, path, map_location: Optional[Any] = None, weights_only: Optional[bool] = None) -> dict:
        resume, self._resume = self._resume, None
        if resume is not None and Path(path).resolve() == resume.path:
            return resume.checkpoint
        return load_checkpoint(Path(path))


class LastCheckpoint(Checkpoint):
    """`last.ckpt` every N steps, at the end, and when the run stops on Ctrl-C, SIGTERM or too many skips.

    A stop for any other exception saves nothing: the step may have died half-way through an update,
    and the previous `last.ckpt` is the safer place to continue from.
    """

    def __init__(self, path: Path, every_n_steps: int):
        self.path, self.every_n_steps = Path(path), every_n_steps
        self.saved_step = -1

    def on_train_batch_end(self, trainer: L.Trainer, *args) -> None:
        step = trainer.global_step
        if step > 0 and step % self.every_n_steps == 0:
            self.save(trainer)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.save(trainer)

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        if isinstance(exception, SAVE_ON) and trainer.global_step > 0 and not trainer.sanity_checking:
            self.save(trainer)
            log.info("Saved %s at step %d before stopping.", self.path.name, trainer.global_step)

    def save(self, trainer: L.Trainer) -> None:
        if trainer.global_step != self.saved_step:
            trainer.save_checkpoint(self.path, weights_only=False)  # the whole training state
            self.saved_step = trainer.global_step


def best_metric(config: VoiceConfig) -> str:
    """The logged metric best.ckpt (and samples/best) follow: train.best_metric, lower is better."""
    return "eval/cer" if config.train.best_metric == "cer" else "val_loss"


def checkpoint_callbacks(config: VoiceConfig, folder: Path) -> list[Checkpoint]:
    """step-<N>.ckpt (newest train.keep_last_k), best.ckpt (lowest train.best_metric) and last.ckpt."""
    train = config.train
    callbacks: list[Checkpoint] = []
    if train.keep_last_k > 0:
        callbacks.append(ModelCheckpoint(
            dirpath=folder, filename="step-{step}", monitor="step", mode="max", save_top_k=train.keep_last_k,
            every_n_train_steps=train.checkpoint_every_n_steps, auto_insert_metric_name=False,
            enable_version_counter=False, save_on_train_epoch_end=False))
    by_cer = train.best_metric == "cer"  # eval/cer comes from the evaluation callback, every eval.every_n_steps
    callbacks.append(ModelCheckpoint(
        dirpath=folder, filename=Path(BEST).stem, monitor=best_metric(config), mode="min", save_top_k=1,
        every_n_train_steps=(config.eval.every_n_steps or None) if by_cer else None, auto_insert_metric_name=False,
        enable_version_counter=False, save_on_train_epoch_end=False))
    callbacks.append(LastCheckpoint(folder / LAST, train.checkpoint_every_n_steps))
    return callbacks


@dataclass
class ResumePoint:
    path: Path
    global_step: int
    epoch: int
    checkpoint: dict = field(repr=False)

    def describe(self, run_dir: Path) -> str:
        shown = self.path.relative_to(run_dir) if self.path.is_relative_to(run_dir) else self.path
        return f"Resuming from {shown.as_posix()} at step {self.global_step} (epoch {self.epoch})."


def resume_point(resume: str, folder: Path) -> Optional[ResumePoint]:
    """What `--resume auto|never|PATH` continues from. auto: the newest readable of last.ckpt and
    step-<N>.ckpt (an unreadable one is refused with its reason, and the next one is tried)."""
    if resume == "never":
        return None
    if resume != "auto":
        return _point(Path(resume), load_checkpoint(Path(resume)))  # a named file must be good: refused otherwise
    steps = sorted(((int(m.group(1)), path) for path in folder.glob("step-*.ckpt")
                    if (m := STEP_PATTERN.match(path.name))), reverse=True)
    candidates = ([(None, folder / LAST)] if (folder / LAST).is_file() else []) + steps
    best: Optional[ResumePoint] = None
    for named_step, path in candidates:
        if best is not None and named_step is not None and named_step <= best.global_step:
            break  # step files are sorted newest first: nothing later can be newer
        try:
            point = _point(path, load_checkpoint(path))
        except CheckpointError as exc:
            log.warning("Not resuming from %s: %s", path.name, exc)
            continue
        if best is None or point.global_step > best.global_step:
            best = point
    return best


def _point(path: Path, ckpt: dict) -> ResumePoint:
    return ResumePoint(path.resolve(), int(ckpt.get("global_step", 0)), int(ckpt.get("epoch", 0)), ckpt)
