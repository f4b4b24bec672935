"""Batches from the feature cache: Dataset, collate, train/validation split and DataLoaders.

Everything here is picklable and does no work at import time, so DataLoader workers started with
`spawn` (Windows, macOS, or forced) import this module and nothing else happens.
"""

from __future__ import annotations

import hashlib
import io
import zlib
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Optional

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from voicesmith.audio import MEL_FLOOR
from voicesmith.data.sampler import LengthBucketBatchSampler
from voicesmith.errors import DataError

if TYPE_CHECKING:
    from voicesmith.config import VoiceConfig
    from voicesmith.data.cache import FeatureBuilder, FeatureCache

INT16_SCALE = 32767.0  # the cache stores waveforms as int16 (see data/cache.py)


class TTSDataset(Dataset):
    """Items of the feature cache; holds only manifest entries (small, picklable).

    Each feature file is checked against the manifest's CRC-32 before use: a damaged one is rebuilt
    from its recording with `builder` (or refused without one), never fed to the model.
    """

    def __init__(self, root: Path, entries: list[dict], hop_length: int, builder: Optional["FeatureBuilder"] = None):
        self.root, self.entries, self.hop_length = Path(root), entries, hop_length
        self.builder = builder

    def __len__(self) -> int:
        return len(self.entries)

    @property
    def lengths(self) -> list[int]:
        return [entry["n_frames"] for entry in self.entries]

    def __getitem__(self, index: int) -> dict:
        entry = self.entries[index]
        path = self.root / entry["file"]
        try:
            features = torch.load(io.BytesIO(self._checked_bytes(entry, path)), map_location="cpu", weights_only=True)
        except (OSError, RuntimeError, EOFError) as exc:
            raise DataError(f"The cached features of item {entry['id']} ({path}) cannot be read ({exc}); "
                            f"run `voicesmith prepare CONFIG` to rebuild the cache.") from exc
        mel, audio = features["mel"], features["audio"]
        if mel.shape[-1] != entry["n_frames"] or audio.shape[-1] != entry["n_frames"] * self.hop_length:
            raise DataError(f"The cached features of item {entry['id']} ({path}) do not match the manifest; "
                            f"run `voicesmith prepare CONFIG` to rebuild the cache.")
        # numpy for the conversion: single-threaded, so no thread-pool overhead per item in the main process
        audio = torch.from_numpy(audio.numpy().astype(np.float32) * np.float32(1 / INT16_SCALE))
        return {"id": entry["id"], "text": entry["text"], "phoneme_ids": torch.tensor(entry["ids"], dtype=torch.long),
                "mel": mel.float(), "audio": audio, "speaker_id": entry["speaker_id"]}


    def _checked_bytes(self, entry: dict, path: Path) -> bytes:
        """The file's bytes when their CRC-32 matches the manifest; else rebuilt (or DataError)."""
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            data = b""
        if "crc32" not in entry or zlib.crc32(data) == entry["crc32"]:
            return data
        if self.builder is None:
            raise DataError(f"The cached features of item {entry['id']} ({path}) are damaged (checksum mismatch); "
                            f"run `voicesmith prepare CONFIG` to rebuild them.")
        from voicesmith.data.cache import rebuild_features

        return rebuild_features(self.builder, self.root, entry)


def collate_batch(items: list[dict]) -> dict:
    """Pad to the longest item: ids with 0, mels with MEL_FLOOR (silence), audio with 0; lengths kept."""
    phoneme_lengths = torch.tensor([len(item["phoneme_ids"]) for item in items], dtype=torch.long)
    mel_lengths = torch.tensor([item["mel"].shape[-1] for item in items], dtype=torch.long)
    audio_lengths = torch.tensor([item["audio"].shape[-1] for item in items], dtype=torch.long)
    batch_size, n_mels = len(items), items[0]["mel"].shape[0]
    phoneme_ids = torch.zeros(batch_size, int(phoneme_lengths.max()), dtype=torch.long)
    mels = torch.full((batch_size, n_mels, int(mel_lengths.max())), MEL_FLOOR, dtype=torch.float32)
    audio = torch.zeros(batch_size, int(audio_lengths.max()), dtype=torch.float32)
    for row, item in enumerate(items):
        phoneme_ids[row, :phoneme_lengths[row]] = item["phoneme_ids"]
        mels[row, :, :mel_lengths[row]] = item["mel"]
        audio[row, :audio_lengths[row]] = item["audio"]
    return {"ids": [item["id"] for item in items], "texts": [item["text"] for item in items],
            "phoneme_ids": phoneme_ids, "phoneme_lengths": phoneme_lengths, "mels": mels,
            "mel_lengths": mel_lengths, "audio": audio, "audio_lengths": audio_lengths,
            "speaker_ids": torch.tensor([item["speaker_id"] for item in items], dtype=torch.long)}


# --- train / validation split ----------------------------------------------------------------------

def _rank_key(seed: int, item_id: str) -> str:
    """A stable pseudo-random order: adding items to a corpus does not reshuffle the others."""
    return hashlib.sha1(f"{seed}:{item_id}".encode("utf-8")).hexdigest()


def split_entries(entries: list[dict], val_fraction: float, val_max_items: int,
                  seed: int) -> tuple[list[int], list[int]]:
    """Deterministic train/validation indices, stratified by speaker (each keeps a training item)."""
    n_val = 0 if val_fraction <= 0 or len(entries) < 2 else \
        min(val_max_items, len(entries) - 1, max(1, round(len(entries) * val_fraction)))
    by_speaker = _by_speaker(range(len(entries)), entries, seed)
    quotas = _proportional_quotas({name: len(indices) for name, indices in by_speaker.items()}, n_val)
    val = sorted(index for name, indices in by_speaker.items() for index in indices[:min(quotas[name], len(indices) - 1)])
    chosen = set(val)
    return [index for index in range(len(entries)) if index not in chosen], val


def _by_speaker(indices: Iterable[int], entries: list[dict], seed: int) -> dict[str, list[int]]:
    """Indices grouped by speaker, each group in the stable `_rank_key` order."""
    groups: dict[str, list[int]] = defaultdict(list)
    for index in sorted(indices, key=lambda i: _rank_key(seed, entries[i]["id"])):
        groups[entries[index]["speaker"]].append(index)
    return groups


def _proportional_quotas(sizes: dict[str, int], total: int) -> dict[str, int]:
    """Split `total` over groups in proportion to their sizes (largest remainder, ties by name)."""
    count = sum(sizes.values())
    shares = {name: total * size / count for name, size in sizes.items()} if count else {}
    quotas = {name: int(share) for name, share in shares.items()}
    leftover = total - sum(quotas.values())
    for name in sorted(shares, key=lambda n: (quotas[n] - shares[n], n))[:leftover]:
        quotas[name] += 1
    return quotas


def limit_entries(indices: list[int], entries: list[dict], max_samples: Optional[int], seed: int) -> list[int]:
    """At most max_samples indices, speakers in proportion (for quick runs); deterministic."""
    if max_samples is None or max_samples >= len(indices):
        return indices
    by_speaker = _by_speaker(indices, entries, seed)
    quotas = _proportional_quotas({name: len(group) for name, group in by_speaker.items()}, max_samples)
    return sorted(index for name, group in by_speaker.items() for index in group[:quotas[name]])


# --- loaders --------------------------------------------------------------------------------------------

def build_dataloaders(config: "VoiceConfig", cache: "FeatureCache", max_samples: Optional[int] = None,
                      world_size: int = 1, rank: int = 0, multiprocessing_context: Optional[str] = None,
                      ) -> tuple[DataLoader, Optional[DataLoader]]:
    """(train loader, validation loader or None when there is no validation item).

    The batch sampler shards over `world_size` ranks itself: with Lightning, pass the trainer's
    world size and global rank and set `use_distributed_sampler=False`.
    """
    from voicesmith.data.cache import FeatureBuilder, audio_key

    if cache.audio_key != audio_key(config):
        raise DataError(f"The feature cache {cache.root} was prepared with other audio settings; run "
                        f"`voicesmith prepare CONFIG` again (train does this itself).")
    data = config.data
    train_idx, val_idx = split_entries(cache.entries, data.val_fraction, data.val_max_items, data.seed)
    train_idx = limit_entries(train_idx, cache.entries, max_samples or data.max_samples, data.seed)
    loaders = []
    for indices, shuffle in ((train_idx, True), (val_idx, False)):
        if not indices:
            loaders.append(None)
            continue
        dataset = TTSDataset(cache.root, [cache.entries[i] for i in indices], config.audio.hop_length,
                             FeatureBuilder(config.audio, config.data))
        sampler = LengthBucketBatchSampler(dataset.lengths, config.train.batch_size, data.max_frames_per_batch,
                                           shuffle=shuffle, seed=data.seed, num_replicas=world_size, rank=rank)
        loaders.append(_loader(dataset, sampler, config, multiprocessing_context))
    return loaders[0], loaders[1]


def _loader(dataset: TTSDataset, sampler: LengthBucketBatchSampler, config: "VoiceConfig",
            multiprocessing_context: Optional[str]) -> DataLoader:
    workers = config.data.num_workers
    pin_memory = config.data.pin_memory
    if pin_memory is None:
        pin_memory = config.hardware.accelerator in ("auto", "cuda", "gpu") and torch.cuda.is_available()
    extra = {"prefetch_factor": config.data.prefetch_factor, "persistent_workers": True,
             "multiprocessing_context": multiprocessing_context} if workers > 0 else {}
    # Its own generator: starting an iterator draws a worker seed from it, which would otherwise come from the
    # global RNG and shift the model's random stream whenever a resumed run starts an epoch's iterator anew.
    generator = torch.Generator().manual_seed(config.data.seed)
    return DataLoader(dataset, batch_sampler=sampler, collate_fn=collate_batch, num_workers=workers,
                      pin_memory=pin_memory, generator=generator, **extra)
