"""Data for the engine: validated and cached once (on global rank 0), then loaded on every rank.

Lightning runs `prepare_data` on one process while the others wait, then `setup` everywhere:
exactly what a feature cache on a shared disk needs under DDP.
"""

from __future__ import annotations

from typing import Optional

import lightning as L
import torch
from torch.utils.data import DataLoader

from voicesmith.config import VoiceConfig
from voicesmith.data.cache import FeatureCache, prepare
from voicesmith.data.loader import TTSDataset, build_dataloaders, collate_batch
from voicesmith.data.report import ValidationReport

MEL_STATS_ITEMS = 256  # enough items for stable per-channel statistics, few enough to read in a second


class VoiceDataModule(L.LightningDataModule):
    def __init__(self, config: VoiceConfig, max_samples: Optional[int] = None, progress: bool = False):
        super().__init__()
        self.config, self.max_samples, self.progress = config, max_samples, progress
        self.prepare_data_per_node = False  # one cache on a shared disk, written by global rank 0
        self.report: Optional[ValidationReport] = None
        self.cache: Optional[FeatureCache] = None
        self.train_loader: Optional[DataLoader] = None
        self.val_loader: Optional[DataLoader] = None

    def prepare_data(self) -> None:
        """Validation report (also RUN_DIR/data_report.json) and features; DataError when nothing is usable."""
        self.cache = prepare(self.config, progress=self.progress)  # other ranks load it in setup
        self.report = self.cache.report

    def setup(self, stage: str) -> None:
        if self.cache is None:
            self.cache = FeatureCache.load(self.config.resolve(self.config.data.cache_dir))
        world_size, rank = (self.trainer.world_size, self.trainer.global_rank) if self.trainer else (1, 0)
        if self.train_loader is None:
            self.train_loader, self.val_loader = build_dataloaders(
                self.config, self.cache, self.max_samples, world_size, rank)

    @property
    def symbols(self):
        return self.cache.symbols

    @property
    def speakers(self) -> dict[str, int]:
        return self.cache.speakers

    def train_dataloader(self) -> DataLoader:
        return self.train_loader

    def val_dataloader(self):
        return self.val_loader if self.val_loader is not None else []

    def counts(self) -> dict[str, int]:
        """Items the run used and left out, for summary.json."""
        train = len(self.train_loader.dataset) if self.train_loader is not None else 0
        val = len(self.val_loader.dataset) if self.val_loader is not None else 0
        counts = {"items_used": train + val, "items_train": train, "items_val": val}
        if self.report is not None:
            counts["items_excluded"] = self.report.items_excluded
        return counts

    def mel_stats(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-channel mean/std of the training mels (evenly spaced items), for the model's normalisation."""
        from voicesmith.models.acoustic import mel_statistics

        dataset: TTSDataset = self.train_loader.dataset
        step = max(1, len(dataset) // MEL_STATS_ITEMS)
        batch = collate_batch([dataset[i] for i in range(0, len(dataset), step)][:MEL_STATS_ITEMS])
        return mel_statistics(batch["mels"], batch["mel_lengths"])

    def reference_items(self, n: int) -> list[dict]:
        """The first n validation items (training items when there is no validation split), with audio,
        for samples: each is synthesised from its own phoneme ids next to its recording."""
        loader = self.val_loader or self.train_loader
        dataset: TTSDataset = loader.dataset
        items = []
        for index in range(min(n, len(dataset))):
            item = dataset[index]
            item["speaker"] = dataset.entries[index].get("speaker", "")
            items.append(item)
        return items
