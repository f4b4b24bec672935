"""Evaluation during training: the numbers of `voicesmith eval` on a few validation items, as it learns.

Every `eval.every_n_steps` steps (0: off) the live weights speak the first `eval.limit` items of the
validation split through `Synthesizer.from_model` and `voicesmith.evaluate.evaluate`, the same code
as `voicesmith eval`. Logged as `eval/cer`, `eval/wer`, `eval/mcd`, `eval/duration_ratio`,
`eval/rtf`, the synthesis's DNSMOS `eval/dnsmos_ovrl`, `_sig`, `_bak`, `_p808`, and two lower-is-better
views of naturalness: `eval/dnsmos_shortfall` = (5 - OVRL) / 4 (0 at the top of the scale, 1 at the
bottom) and `eval/cer_dnsmos` = the mean of CER and that shortfall (CER/WER and `cer_dnsmos` only for
languages with a recogniser). The recordings' side (transcripts, trimmed audio, DNSMOS) is computed
once and kept.

The metrics are also logged through the module, so a `ModelCheckpoint(monitor="eval/cer",
every_n_train_steps=eval.every_n_steps)` sees them in the same step and can keep `best.ckpt` by CER
(train.best_metric = "cer"), by naturalness ("dnsmos": eval/dnsmos_shortfall) or by both
("cer_dnsmos": a voice must stay intelligible while it gets more natural). Global rank 0 evaluates
and broadcasts the numbers, so every rank logs the same values and checkpoint decisions agree. A
failed evaluation is counted and logged, and training goes on.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Optional

import lightning as L
from lightning.pytorch.callbacks import Callback

from voicesmith.asr import has_recognizer
from voicesmith.config import VoiceConfig
from voicesmith.data.formats import CorpusItem
from voicesmith.dnsmos import check_available as check_dnsmos_available
from voicesmith.dnsmos import shortfall
from voicesmith.errors import ConfigError, UserInputError
from voicesmith.evaluate import Reference, evaluate, validation_items
from voicesmith.inference import Synthesizer

log = logging.getLogger(__name__)

CER_METRIC = "eval/cer"
LOGGED = ("cer", "wer", "mcd", "duration_ratio", "rtf", "dnsmos_ovrl", "dnsmos_sig", "dnsmos_bak", "dnsmos_p808")


def eval_callbacks(config: VoiceConfig) -> list[Callback]:
    """[EvalCallback] when eval.every_n_steps is on, else []; refuses a best_metric it cannot serve, and
    evaluation without the naturalness models (every evaluation would fail)."""
    metric = config.train.best_metric
    if metric != "val_loss" and not config.eval.every_n_steps:
        raise ConfigError(f"train.best_metric={metric} needs evaluation during training: set eval.every_n_steps "
                          f"(e.g. --set eval.every_n_steps=500), or use train.best_metric=val_loss.")
    if metric in ("cer", "cer_dnsmos") and not has_recognizer(config.text.language):
        raise ConfigError(f"train.best_metric={metric} needs a speech recogniser, and there is none for "
                          f"text.language={config.text.language!r} (English only); use train.best_metric=dnsmos "
                          f"or val_loss.")
    if not config.eval.every_n_steps:
        return []
    try:
        check_dnsmos_available()
    except UserInputError as exc:
        raise ConfigError(f"eval.every_n_steps={config.eval.every_n_steps} evaluates during training, and that "
                          f"needs the naturalness models: {exc} Or set eval.every_n_steps=0.") from None
    return [EvalCallback(config)]


class EvalCallback(Callback):
    def __init__(self, config: VoiceConfig):
        self.config = config
        self.every_n_steps, self.limit = config.eval.every_n_steps, config.eval.limit
        self.items: Optional[list[CorpusItem]] = None
        self.synthesizer: Optional[Synthesizer] = None
        self.references: dict[str, Reference] = {}
        self.latest: dict[str, float] = {}
        self.last_step = -1
        self.evaluations = self.failed = 0
        self.seconds = 0.0

    @property
    def latest_cer(self) -> Optional[float]:
        return self.latest.get("cer")

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch,
                           batch_idx) -> None:
        step = trainer.global_step
        if not self.every_n_steps or not step or step % self.every_n_steps or step == self.last_step:
            return
        self.last_step = step
        metrics = self._evaluate(pl_module) if trainer.is_global_zero else None
        metrics = trainer.strategy.broadcast(metrics, src=0)
        if metrics is None:
            return
        self.latest = metrics
        for name, value in metrics.items():  # callback_metrics: what ModelCheckpoint monitors
            pl_module.log(f"eval/{name}", value, on_step=True, on_epoch=False, logger=False, sync_dist=False)
        if trainer.is_global_zero:  # straight to the loggers: this step need not be a logging step
            for logger in trainer.loggers:
                logger.log_metrics({f"eval/{name}": value for name, value in metrics.items()}, step=step)

    def _evaluate(self, pl_module: L.LightningModule) -> Optional[dict[str, float]]:
        started = time.perf_counter()
        try:
            if self.items is None:
                self.items = validation_items(self.config, pl_module.symbols)[:self.limit]
            if self.synthesizer is None or self.synthesizer.model is not pl_module.model:
                self.synthesizer = Synthesizer.from_model(pl_module.model, self.config, pl_module.symbols,
                                                          pl_module.speakers)  # live weights; front end built once
            result = evaluate(self.synthesizer, self.items, self.limit, self.references)
        except Exception as exc:  # noqa: BLE001 - an evaluation is never worth a lost run; counted and logged
            self.failed += 1
            log.warning("Evaluation failed and was skipped (%s: %s).", type(exc).__name__, exc)
            return None
        finally:
            self.seconds += time.perf_counter() - started
        self.evaluations += 1
        metrics = {name: float(result[name]) for name in LOGGED if result[name] is not None}
        metrics["dnsmos_shortfall"] = shortfall(metrics["dnsmos_ovrl"])
        if "cer" in metrics:
            metrics["cer_dnsmos"] = (metrics["cer"] + metrics["dnsmos_shortfall"]) / 2
        log.info("Evaluation on %d validation item(s): %s (%.1f s).", result["n_items"],
                 ", ".join(f"{name} {value:.3f}" for name, value in metrics.items()), time.perf_counter() - started)
        return metrics

    def summary(self) -> dict[str, Any]:
        return {"eval": {"evaluations": self.evaluations, "failed": self.failed, "seconds": round(self.seconds, 3),
                         "latest": self.latest}}
