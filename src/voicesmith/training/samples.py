"""Samples during training: hear the voice as it learns, from the weights being trained.

Every `samples.every_n_steps` steps (and on each new best of train.best_metric when `samples.on_best`),
the live model speaks `samples.texts` and the first `samples.n_references` validation items, in this
process, in eval mode under no_grad (the Synthesizer restores train mode afterwards). Written to
RUN_DIR/samples/step_<N>/ (or samples/best/): `<name>.wav`, `<id>_reference.wav` (the recording)
and `<name>.png` (mel and alignment); logged to TensorBoard as audio and images. Each sample step
also refreshes RUN_DIR/report.html (voicesmith.report), where they can be heard side by side. A sample that
fails on the accelerator is retried once on the CPU with a copy of the weights; a sample that fails
there too is counted and logged, and training goes on: samples are never worth a lost run.
"""

from __future__ import annotations

import copy
import logging
import re
import shutil
import time
from pathlib import Path
from typing import Any, Callable, Optional

import lightning as L
import numpy as np
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import TensorBoardLogger

from voicesmith.audio import check_wav, write_wav
from voicesmith.config import VoiceConfig
from voicesmith.inference import SynthesisResult, Synthesizer
from voicesmith.report import refresh_report
from voicesmith.training.checkpointing import best_metric
from voicesmith.training.console import ROUTINE

log = logging.getLogger(__name__)

Speak = Callable[[Synthesizer], SynthesisResult]


class SamplesCallback(Callback):
    def __init__(self, config: VoiceConfig, folder: Path):
        self.config, self.folder = config, Path(folder)
        self.samples = config.samples
        self.references: list[dict] = []
        self.metric = best_metric(config)
        self.best_score = float("inf")
        self.last_step = -1
        self.written = self.failed = self.with_problems = self.cpu_retries = 0
        self.seconds = 0.0
        self._live: Optional[Synthesizer] = None  # wraps the live model; built once (its text front end is not free)

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if trainer.is_global_zero and self.samples.n_references and trainer.datamodule is not None:
            self.references = trainer.datamodule.reference_items(self.samples.n_references)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx) -> None:
        step, every = trainer.global_step, self.samples.every_n_steps
        if every and step and step % every == 0 and step != self.last_step and trainer.is_global_zero:
            self.last_step = step
            self.write(trainer, pl_module, self.folder / f"step_{step}")
        self._on_new_best(trainer, pl_module)  # eval/cer arrives in a training step

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """A run always leaves samples of the weights it ends with, whatever its cadence."""
        step = trainer.global_step
        if self.samples.every_n_steps and step and step != self.last_step and trainer.is_global_zero:
            self.last_step = step
            self.write(trainer, pl_module, self.folder / f"step_{step}")

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.sanity_checking:
            self._on_new_best(trainer, pl_module)

    def _on_new_best(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """samples/best/ follows best.ckpt: rewritten whenever the best metric improves."""
        value = trainer.callback_metrics.get(self.metric)
        if value is None or not float(value) < self.best_score:
            return
        self.best_score = float(value)
        if self.samples.on_best and trainer.is_global_zero:
            best = self.folder / "best"
            shutil.rmtree(best, ignore_errors=True)  # only the current best's samples belong there
            self.write(trainer, pl_module, best)

    def state_dict(self) -> dict[str, Any]:
        return {"metric": self.metric, "best_score": self.best_score}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if state_dict.get("metric") == self.metric:
            self.best_score = float(state_dict.get("best_score", float("inf")))

    # --- writing -----------------------------------------------------------------------------------

    def write(self, trainer: L.Trainer, pl_module: L.LightningModule, folder: Path) -> None:
        started = time.perf_counter()
        folder.mkdir(parents=True, exist_ok=True)
        model, step = pl_module.model, trainer.global_step
        jobs: list[tuple[str, Speak, Optional[dict]]] = [
            (f"sample-{index + 1:02d}", _speak_text(text), None) for index, text in enumerate(self.samples.texts)]
        jobs += [(safe_name(item["id"]), _speak_item(item), item) for item in self.references]
        written_before = self.written
        for name, speak, reference in jobs:
            result = self._synthesize(pl_module, model, speak, name)
            if result is None:
                continue  # counted and logged in _synthesize
            try:
                self._save(trainer, folder, name, result, reference, step)
            except Exception as exc:  # noqa: BLE001 - a sample must never stop training; counted and logged
                self.failed += 1
                log.warning("Sample %s could not be saved (%s: %s).", name, type(exc).__name__, exc)
        seconds = time.perf_counter() - started
        self.seconds += seconds
        for logger in trainer.loggers:
            logger.log_metrics({"time/samples_s": seconds}, step=step)
        log.info("Wrote %d of %d sample(s) to %s in %.1f s.", self.written - written_before, len(jobs), folder, seconds,
                 extra=ROUTINE)
        if folder.name != "best":  # RUN_DIR/report.html follows the sample steps, with metrics.csv up to this one
            started = time.perf_counter()
            for logger in trainer.loggers:
                logger.save()
            refresh_report(self.config.run_dir, training_step=step)
            for logger in trainer.loggers:
                logger.log_metrics({"time/report_s": time.perf_counter() - started}, step=step)

    def _synthesize(self, pl_module: L.LightningModule, model: torch.nn.Module, speak: Speak,
                    name: str) -> Optional[SynthesisResult]:
        """The live weights first; on an accelerator failure, a CPU copy once; then give up on this sample."""
        device = next(model.parameters()).device
        if self._live is None or self._live.model is not model:
            self._live = self._synthesizer(pl_module, model)
        try:
            return speak(self._live)
        except Exception as exc:  # noqa: BLE001 - a sample must never stop training; counted and logged
            if device.type == "cpu":
                self.failed += 1
                log.warning("Sample %s failed and was left out (%s: %s).", name, type(exc).__name__, exc)
                return None
            log.warning("Sample %s failed on %s (%s: %s); retrying on the CPU with a copy of the weights.",
                        name, device, type(exc).__name__, exc)
        self.cpu_retries += 1
        try:
            return speak(self._synthesizer(pl_module, copy.deepcopy(model).cpu()))
        except Exception as exc:  # noqa: BLE001 - as above
            self.failed += 1
            log.warning("Sample %s failed on the CPU too and was left out (%s: %s).", name, type(exc).__name__, exc)
            return None

    def _synthesizer(self, pl_module: L.LightningModule, model: torch.nn.Module) -> Synthesizer:
        return Synthesizer.from_model(model, self.config, pl_module.symbols, pl_module.speakers,
                                      self.samples.griffin_lim_iters)

    def _save(self, trainer: L.Trainer, folder: Path, name: str, result: SynthesisResult,
              reference: Optional[dict], step: int) -> None:
        sample_rate = result.sample_rate
        wav = folder / f"{name}.wav"
        try:
            write_wav(wav, result.audio, sample_rate)
        except ValueError as exc:  # NaN audio from a diverging model: say so, keep training
            self.failed += 1
            log.warning("Sample %s was not written: %s", name, exc)
            return
        self.written += 1
        problems = check_wav(wav, sample_rate)
        if problems:
            self.with_problems += 1
            log.warning("Sample %s: %s", name, "; ".join(problems))
        reference_mel = None
        if reference is not None:
            write_wav(folder / f"{name}_reference.wav", reference["audio"].numpy(), sample_rate)
            reference_mel = reference["mel"].numpy()
        image = plot_sample(folder / f"{name}.png", result.mel, result.alignment, reference_mel, f"{name}, step {step}")
        for logger in trainer.loggers:
            if isinstance(logger, TensorBoardLogger):
                writer = logger.experiment
                audio = torch.from_numpy(np.clip(result.audio, -1, 1))[None]  # TensorBoard wants [-1, 1]
                writer.add_audio(f"samples/{name}", audio, step, sample_rate)
                writer.add_image(f"samples/{name}", image, step, dataformats="HWC")

    def summary(self) -> dict[str, Any]:
        return {"samples": {"written": self.written, "failed": self.failed, "with_problems": self.with_problems,
                            "cpu_retries": self.cpu_retries, "seconds": round(self.seconds, 3)}}


def safe_name(item_id: str) -> str:
    """An item id as a file name (filelist ids are paths and may hold '/')."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", item_id)[:100]


def _speak_text(text: str) -> Speak:
    return lambda synth: synth.synthesize_detailed(text)


def _speak_item(item: dict) -> Speak:
    speaker = item.get("speaker") or None
    return lambda synth: synth.synthesize_ids(item["phoneme_ids"].tolist(), speaker=speaker)


def plot_sample(path: Path, mel: np.ndarray, alignment: np.ndarray, reference_mel: Optional[np.ndarray],
                title: str) -> np.ndarray:
    """PNG of the mel (and the recording's mel) over the alignment; returns the RGB pixels for TensorBoard."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    panels = [("synthesised mel", mel, "mel bin")]
    if reference_mel is not None:
        panels.append(("recording's mel", reference_mel, "mel bin"))
    panels.append(("alignment", alignment, "phoneme"))
    figure = Figure(figsize=(8, 2.2 * len(panels)), dpi=64)
    canvas = FigureCanvasAgg(figure)
    for index, (label, data, ylabel) in enumerate(panels):
        axes = figure.add_subplot(len(panels), 1, index + 1)
        axes.imshow(data, origin="lower", aspect="auto", interpolation="none")
        axes.set_title(f"{title}: {label}" if index == 0 else label, fontsize=9)
        axes.set_ylabel(ylabel)
    figure.axes[-1].set_xlabel("frame")
    figure.tight_layout()
    figure.savefig(path)
    canvas.draw()
    return np.asarray(canvas.buffer_rgba())[..., :3].copy()
