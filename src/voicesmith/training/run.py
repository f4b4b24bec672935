"""`voicesmith train`: build the run from its config, train, and always leave RUN_DIR/summary.json.

Run directory (DESIGN.md): config.yaml, data_report.json (written by data preparation),
checkpoints/{last,best,step-<N>}.ckpt, samples/step_<N>/ and samples/best/, logs/ (TensorBoard
events, metrics.csv, train.log, skipped_batches.jsonl) and summary.json, written on every exit:
completed, interrupted (Ctrl-C, SIGTERM: last.ckpt is saved first) or failed.
"""

from __future__ import annotations

import json
import logging
import signal
import sys
import threading
import time
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Optional, Sequence

import lightning as L
from lightning.fabric.utilities.rank_zero import rank_zero_only
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from torch import nn

from voicesmith.checkpoint import BEST, CHECKPOINTS, LAST
from voicesmith.config import VoiceConfig, load_config, preset_dict
from voicesmith.errors import RunFailed
from voicesmith.fileio import atomic_write_json
from voicesmith.report import REPORT, refresh_report
from voicesmith.rundir import owned_run_dir
from voicesmith.training.callbacks import LossTable, TimeBudget, TrainingLog
from voicesmith.training.checkpointing import (AtomicCheckpointIO, BatchPosition, ResumePoint, best_metric,
                                               checkpoint_callbacks, resume_point)
from voicesmith.training.console import Console
from voicesmith.training.datamodule import VoiceDataModule
from voicesmith.training.guard import SkipGuard
from voicesmith.training.hardware import apply_env_switches, trainer_hardware
from voicesmith.training.loggers import LOG_FOLDER, build_loggers
from voicesmith.training.module import VoiceModule
from voicesmith.training.profiling import DataWaitProfiler, MemoryMonitor, StepProfiler
from voicesmith.training.samples import SamplesCallback

log = logging.getLogger("voicesmith")

SUMMARY = "summary.json"
PROGRESS_LINE_STEPS = 10  # a progress line every log_every_n_steps * this many steps


def train_command(config_path: Path, resume: str = "auto", max_steps: Optional[int] = None,
                  max_epochs: Optional[int] = None, max_samples: Optional[int] = None, stage: Optional[str] = None,
                  overrides: Sequence[str] = ()) -> int:
    """`voicesmith train CONFIG`: 0 when the run completed, 1 when it was interrupted; errors raise
    (RunFailed: exit 1, bad input: exit 2) after summary.json is written."""
    config = load_config(config_path, list(overrides))
    summary = train(config, resume=resume, max_steps=max_steps, max_epochs=max_epochs, max_samples=max_samples,
                    stage=stage)
    if rank_zero_only.rank == 0:
        where = config.run_dir / SUMMARY
        if (config.run_dir / REPORT).is_file():
            print(f"Report (curves, samples to listen to, data): {config.run_dir / REPORT}")
        if summary["status"] == "completed":
            print(f"Training completed at step {summary['global_step']} ({summary['reason']}). "
                  f"Checkpoint: {summary['checkpoint']}; summary: {where}")
        else:
            resume = (f"Run the same command to continue from {summary['checkpoint']}" if summary["checkpoint"]
                      else "No checkpoint was saved yet")
            print(f"Training {summary['status']} at step {summary['global_step']} ({summary['reason']}). "
                  f"{resume}; summary: {where}")
    return 0 if summary["status"] == "completed" else 1


def train(config: VoiceConfig, resume: str = "auto", max_steps: Optional[int] = None,
          max_epochs: Optional[int] = None, max_samples: Optional[int] = None, stage: Optional[str] = None,
          callbacks: Sequence[Callback] = (), model: Optional[nn.Module] = None) -> dict[str, Any]:
    """Train `config.model` (or `model`, a module built elsewhere) and return summary.json's content.

    `stage` "both" or "vocoder" on an acoustic run adds or runs the vocoder stage (see training/stages.py).

    `callbacks` are added to the engine's own (e.g. evaluation during training). Raises RunFailed
    and user-input errors after writing the summary; an interrupt returns status "interrupted".
    """
    from voicesmith.training.stages import single_stage, train_stages

    if not single_stage(config, stage):
        return train_stages(config, stage, resume=resume, max_steps=max_steps, max_epochs=max_epochs,
                            max_samples=max_samples, callbacks=callbacks)
    apply_env_switches(config.hardware)  # before anything can touch CUDA
    run_dir = config.run_dir
    run = RunState(config, time.time())
    with owned_run_dir(run_dir, "train", fresh=resume == "never") as claim, run_logging(run_dir), \
            keep_sigint_handler(), warnings.catch_warnings():
        # Lightning warns that step checkpoints under manual optimisation hold the weights after the
        # step's update: exactly what step-<N>.ckpt should hold (N updates done).
        warnings.filterwarnings("ignore", message="Using ModelCheckpoint with manual optimization")
        warnings.filterwarnings("ignore", message=r"Checkpoint directory .* exists and is not empty")  # resuming
        # The batch sampler is resumed mid-epoch by BatchPosition, which Lightning's check does not see.
        warnings.filterwarnings("ignore", message="You're resuming from a checkpoint that ended before the epoch")
        # Lightning's own notes that do not apply: epoch summaries are ours, and a library deprecation.
        warnings.filterwarnings("ignore", message=r"The number of training batches .* is smaller than the logging")
        warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)` is deprecated")
        try:
            hardware = trainer_hardware(config.hardware, has_unused_parameters=config.model.type != "acoustic")
            run.hardware = hardware
            run.point = resume_point(resume, run_dir / CHECKPOINTS)
            log.info((run.point.describe(run_dir) if run.point else f"Starting a new run in {run_dir}.") + claim.note)
            L.seed_everything(config.train.seed, workers=True, verbose=False)
            run.datamodule = VoiceDataModule(config, max_samples, progress=sys.stderr.isatty())
            guard = SkipGuard.from_config(config.train, run_dir / LOG_FOLDER / "skipped_batches.jsonl")
            run.module = VoiceModule(config, model=model, guard=guard, fresh_start=run.point is None)
            run.max_steps, run.max_epochs = resolve_limits(config, max_steps, max_epochs)
            run.trainer = build_trainer(config, hardware, run.max_steps, run.max_epochs,
                                        with_evaluation(config, callbacks), run.point)
            run.trainer.fit(run.module, datamodule=run.datamodule,
                            ckpt_path=str(run.point.path) if run.point else None)
            run.finish("completed", run.completion_reason())
        except (KeyboardInterrupt, SystemExit) as exc:  # Lightning turns Ctrl-C into SystemExit(1), SIGTERM too
            run.finish("interrupted", "SIGTERM" if "SIGTERM" in type(exc).__name__ else "interrupted (Ctrl-C)")
        except RunFailed as exc:
            run.finish("failed", str(exc))
            raise
        except BaseException as exc:
            run.finish("failed", run.error_reason(exc))
            if run.module is not None and run.module.current_ids:
                log.error("Training stopped at once: %s", run.error_reason(exc))
            raise
        finally:
            run.write_summary()
            if rank_zero_only.rank == 0:
                refresh_report(run_dir)  # the page ends with the summary the run just wrote
    return run.summary


def resolve_limits(config: VoiceConfig, max_steps: Optional[int], max_epochs: Optional[int]) -> tuple[int, int]:
    """(max_steps, max_epochs), -1 for no limit; never both unlimited: the preset's default steps then."""
    steps = max_steps if max_steps is not None else (config.train.max_steps if max_epochs is None else None)
    epochs = max_epochs if max_epochs is not None else config.train.max_epochs
    if steps is None and epochs is None:
        steps = preset_dict(config.preset, config.data.dataset, config.model.type)["train"]["max_steps"]
    return (steps if steps is not None else -1), (epochs if epochs is not None else -1)


def with_evaluation(config: VoiceConfig, callbacks: Sequence[Callback]) -> list[Callback]:
    """The caller's callbacks plus evaluation during training when eval.every_n_steps asks for it."""
    from voicesmith.training.eval_callback import EvalCallback, eval_callbacks

    if any(isinstance(callback, EvalCallback) for callback in callbacks):
        return list(callbacks)
    return [*callbacks, *eval_callbacks(config)]


def build_trainer(config: VoiceConfig, hardware: dict[str, Any], max_steps: int, max_epochs: int,
                  extra_callbacks: list[Callback], resume: Optional[ResumePoint] = None) -> L.Trainer:
    run_dir, logging_cfg = config.run_dir, config.logging
    callbacks: list[Callback] = [LossTable(), TrainingLog(logging_cfg.log_every_n_steps * PROGRESS_LINE_STEPS,
                                                          live_line=logging_cfg.progress_bar), BatchPosition()]
    callbacks += extra_callbacks  # before samples: an evaluation's eval/cer is then seen in the same step
    if config.samples.every_n_steps or config.samples.on_best:
        callbacks.append(SamplesCallback(config, run_dir / "samples"))
    profiler = None
    if logging_cfg.profile:
        profiler = DataWaitProfiler()
        callbacks.append(StepProfiler(profiler, logging_cfg.log_every_n_steps))
    if logging_cfg.memory:
        callbacks.append(MemoryMonitor(logging_cfg.log_every_n_steps))
    if config.train.max_minutes:
        callbacks.append(TimeBudget(config.train.max_minutes))
    callbacks += checkpoint_callbacks(config, run_dir / CHECKPOINTS)
    return L.Trainer(
        **hardware, max_steps=max_steps, max_epochs=max_epochs,
        val_check_interval=config.train.val_every_n_steps, check_val_every_n_epoch=None, num_sanity_val_steps=0,
        log_every_n_steps=logging_cfg.log_every_n_steps, logger=build_loggers(logging_cfg, run_dir) or False,
        callbacks=callbacks, enable_progress_bar=False, enable_model_summary=False,  # TrainingLog's live line
        plugins=[AtomicCheckpointIO(resume)], use_distributed_sampler=False, default_root_dir=str(run_dir),
        profiler=profiler)


class RunState:
    """What summary.json reports, gathered as the run gets built, so any exit can write it."""

    def __init__(self, config: VoiceConfig, started: float):
        self.config, self.started = config, started
        self.hardware: dict[str, Any] = {}
        self.point: Optional[ResumePoint] = None
        self.datamodule: Optional[VoiceDataModule] = None
        self.module: Optional[VoiceModule] = None
        self.trainer: Optional[L.Trainer] = None
        self.max_steps = self.max_epochs = -1
        self.summary: dict[str, Any] = {}

    def finish(self, status: str, reason: str) -> None:
        self.summary = {"status": status, "reason": reason}

    def completion_reason(self) -> str:
        trainer = self.trainer
        budget = next((cb for cb in trainer.callbacks if isinstance(cb, TimeBudget)), None)
        if 0 < self.max_steps <= trainer.global_step:
            return f"reached max_steps={self.max_steps}"
        if 0 < self.max_epochs <= trainer.current_epoch:
            return f"reached max_epochs={self.max_epochs}"
        if budget is not None and trainer.should_stop:
            return f"time budget reached (train.max_minutes={self.config.train.max_minutes:g})"
        return "the training loop ended"

    def error_reason(self, exc: BaseException) -> str:
        reason = f"{type(exc).__name__}: {exc}"
        module = self.module
        if module is not None and module.current_ids:
            step = self.trainer.global_step if self.trainer else 0
            reason += f" (at step {step}, training on items {', '.join(module.current_ids)})"
        return reason

    def write_summary(self) -> None:
        self.summary = {**self.summary, **self._details()}
        if rank_zero_only.rank == 0:
            atomic_write_json(self.config.run_dir / SUMMARY, self.summary, indent=2)

    def _details(self) -> dict[str, Any]:
        run_dir, trainer, module = self.config.run_dir, self.trainer, self.module
        start_step = self.point.global_step if self.point else 0
        details: dict[str, Any] = {
            "start_step": start_step,
            "global_step": trainer.global_step if trainer else start_step,
            "epoch": trainer.current_epoch if trainer else (self.point.epoch if self.point else 0),
            "max_steps": self.max_steps, "max_epochs": self.max_epochs,
            **self._items(),
            "batches_skipped": {}, "batches_recovered": {},
            "last_losses": {}, "checkpoint": _relative(run_dir / CHECKPOINTS / LAST, run_dir),
            "best_checkpoint": _relative(run_dir / CHECKPOINTS / BEST, run_dir),
            "best_metric": best_metric(self.config), "best_score": self._best_score(),
            "resumed_from": _relative(self.point.path, run_dir) if self.point else None,
            "device": self.hardware.get("accelerator"), "precision": self.hardware.get("precision"),
            "world_size": trainer.world_size if trainer else None,
            "seconds": round(time.time() - self.started, 3),
        }
        if module is not None:
            details.update(module.guard.summary())
            details["last_losses"] = {name: float(value) for name, value in module.last_losses.items()}
            details["loss_weights"] = module.weights
            details["validation_batches_nonfinite"] = module.val_nonfinite
        for callback in trainer.callbacks if trainer else []:
            if callable(getattr(callback, "summary", None)):  # any callback may add its block to summary.json
                details.update(callback.summary())
        return details

    def _items(self) -> dict[str, Any]:
        """Items used and excluded; from the data report when preparation itself refused the data."""
        if self.datamodule is not None and self.datamodule.train_loader is not None:
            counts = self.datamodule.counts()
            if "items_excluded" in counts:
                return counts
        else:
            counts = {"items_used": 0}
        report_path = self.config.run_dir / "data_report.json"
        if report_path.is_file():
            report = json.loads(report_path.read_text(encoding="utf-8"))
            counts["items_excluded"] = report.get("items_total", 0) - report.get("items_usable", 0)
        else:
            counts["items_excluded"] = None
        return counts

    def _best_score(self) -> Optional[float]:
        for callback in self.trainer.callbacks if self.trainer else []:
            best = callback.best_model_score if isinstance(callback, ModelCheckpoint) else None
            if best is not None and callback.monitor == best_metric(self.config):
                return float(best)
        return None


def _relative(path: Path, run_dir: Path) -> Optional[str]:
    if not path.is_file():
        return None
    path = path.resolve()
    return path.relative_to(run_dir.resolve()).as_posix() if path.is_relative_to(run_dir.resolve()) else str(path)


@contextmanager
def keep_sigint_handler() -> Iterator[None]:
    """Lightning ignores Ctrl-C from its first one on (a graceful stop); the caller gets its handler back."""
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGINT) if main_thread else None
    try:
        yield
    finally:
        if main_thread and previous is not None:
            signal.signal(signal.SIGINT, previous)


@contextmanager
def run_logging(run_dir: Path) -> Iterator[None]:
    """The engine's messages go to RUN_DIR/logs/train.log and, unless the program set up logging, to
    stderr; only rank 0 speaks under DDP."""
    logger = logging.getLogger("voicesmith")
    (run_dir / LOG_FOLDER).mkdir(parents=True, exist_ok=True)
    handlers: list[logging.Handler] = [logging.FileHandler(run_dir / LOG_FOLDER / "train.log", encoding="utf-8")]
    handlers[0].setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    if not logger.handlers and not logging.getLogger().handlers:  # the screen: see training/console.py
        handlers.append(Console(sys.stderr, log_path=str(run_dir / LOG_FOLDER / "train.log")))
    previous_level = logger.level
    logger.setLevel(logging.INFO)
    lightning_logger = logging.getLogger("lightning.pytorch.utilities.rank_zero")  # where its notes come from
    lightning_logger.addFilter(_no_advertisements)
    for handler in handlers:
        handler.addFilter(lambda record: rank_zero_only.rank == 0)
        logger.addHandler(handler)
    try:
        yield
    finally:
        for handler in handlers:
            logger.removeHandler(handler)
            handler.close()
        logger.setLevel(previous_level)
        lightning_logger.removeFilter(_no_advertisements)


def _no_advertisements(record: logging.LogRecord) -> bool:
    """Lightning suggests installing its cloud services; a training log is no place for that."""
    return not str(record.msg).startswith("💡")
