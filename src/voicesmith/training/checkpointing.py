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
from lightning.pytorch.callbacks import Callback, Checkpoint, ModelCheckpoint
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


class BatchPosition(Callback):
    """How far into its epoch the run is, saved in every checkpoint: a run resumed mid-epoch continues
    that epoch's batch list where it stopped (the length-bucketed sampler skips the batches done)
    instead of replaying the epoch's start, so an interrupted and resumed run trains on the same
    batches, in the same order, as an uninterrupted one. Skipped batches count as done.
    """

    def __init__(self):
        self.epoch, self.batches_done = 0, 0
        self.sampler = None

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        from voicesmith.data.sampler import LengthBucketBatchSampler

        loader = getattr(trainer.datamodule, "train_loader", None)  # built in the datamodule's setup, just before
        sampler = getattr(loader, "batch_sampler", None)
        self.sampler = sampler if isinstance(sampler, LengthBucketBatchSampler) else None

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.epoch, self.batches_done = trainer.current_epoch, 0  # not called when resuming mid-epoch

    def on_train_batch_end(self, trainer: L.Trainer, *args) -> None:
        self.batches_done += 1

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "batches_done": self.batches_done}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Restored before the first batch is drawn (Lightning restores callbacks after `setup`)."""
        self.epoch, self.batches_done = int(state["epoch"]), int(state["batches_done"])
        if self.sampler is not None and self.batches_done >= len(self.sampler):
            self.epoch, self.batches_done = self.epoch + 1, 0  # saved after an epoch's last batch: the next one
        if self.sampler is not None:
            self.sampler.resume_at(self.epoch, self.batches_done)


# train.best_metric -> what the evaluation callback logs for it (voicesmith.training.eval_callback)
EVAL_BEST_METRICS = {"cer": "eval/cer", "dnsmos": "eval/dnsmos_shortfall", "cer_dnsmos": "eval/cer_dnsmos"}


class BestCheckpoint(ModelCheckpoint):
    """best.ckpt. A validation round whose every batch had a non-finite loss logs no val_loss (such batches
    are left out on every rank): best.ckpt then stays as it was, where Lightning would stop the run."""

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.monitor not in trainer.callback_metrics and not trainer.sanity_checking:
            log.warning("No validation batch had a finite loss at step %d: %s is not updated this round.",
                        trainer.global_step, Path(BEST).name)
            return
        super().on_validation_end(trainer, pl_module)


def best_metric(config: VoiceConfig) -> str:
    """The logged metric best.ckpt (and samples/best) follow: train.best_metric, lower is better."""
    return EVAL_BEST_METRICS.get(config.train.best_metric, "val_loss")


def checkpoint_callbacks(config: VoiceConfig, folder: Path) -> list[Checkpoint]:
    """step-<N>.ckpt (newest train.keep_last_k), best.ckpt (lowest train.best_metric) and last.ckpt."""
    train = config.train
    callbacks: list[Checkpoint] = []
    if train.keep_last_k > 0:
        callbacks.append(ModelCheckpoint(
            dirpath=folder, filename="step-{step}", monitor="step", mode="max", save_top_k=train.keep_last_k,
            every_n_train_steps=train.checkpoint_every_n_steps, auto_insert_metric_name=False,
            enable_version_counter=False, save_on_train_epoch_end=False))
    by_eval = train.best_metric in EVAL_BEST_METRICS  # eval/* come from the evaluation callback
    callbacks.append(BestCheckpoint(
        dirpath=folder, filename=Path(BEST).stem, monitor=best_metric(config), mode="min", save_top_k=1,
        every_n_train_steps=(config.eval.every_n_steps or None) if by_eval else None, auto_insert_metric_name=False,
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
