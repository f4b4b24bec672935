"""Loggers: TensorBoard and metrics.csv in RUN_DIR/logs by default; W&B and MLflow when enabled."""

from __future__ import annotations

import csv
import importlib.util
from pathlib import Path

from lightning.pytorch.loggers import CSVLogger, Logger, MLFlowLogger, TensorBoardLogger, WandbLogger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter

from voicesmith.config import LoggingConfig
from voicesmith.errors import ConfigError

LOG_FOLDER = "logs"


class _AppendingWriter(ExperimentWriter):
    """Lightning's CSV writer deletes an existing metrics.csv; a resumed run appends to it instead."""

    def _check_log_dir_exists(self) -> None:
        path = Path(self.metrics_file_path)
        if path.is_file():
            with open(path, newline="", encoding="utf-8") as handle:
                self.metrics_keys = sorted(next(csv.reader(handle), []))


class ResumableCSVLogger(CSVLogger):
    @property
    def experiment(self) -> ExperimentWriter:
        if self._experiment is None:
            self._experiment = _AppendingWriter(log_dir=self.log_dir)
        return self._experiment


def build_loggers(cfg: LoggingConfig, run_dir: Path) -> list[Logger]:
    """Every enabled logger; one that is enabled but not installed is refused by name."""
    loggers: list[Logger] = []
    if cfg.tensorboard:
        loggers.append(TensorBoardLogger(save_dir=str(run_dir), name=LOG_FOLDER, version="", default_hp_metric=False))
    if cfg.csv:
        loggers.append(ResumableCSVLogger(save_dir=str(run_dir), name=LOG_FOLDER, version=""))
    if cfg.wandb:
        _require("wandb", "logging.wandb")
        loggers.append(WandbLogger(project=cfg.wandb_project, save_dir=str(run_dir / LOG_FOLDER), name=run_dir.name))
    if cfg.mlflow:
        _require("mlflow", "logging.mlflow")
        loggers.append(MLFlowLogger(experiment_name=run_dir.name, tracking_uri=cfg.mlflow_tracking_uri,
                                    run_name=run_dir.name))
    return loggers


def _require(package: str, key: str) -> None:
    if importlib.util.find_spec(package) is None:
        raise ConfigError(f"{key}=true needs the {package} package, which is not installed: `pip install "
                          f"{package}`, or set {key}=false.")
