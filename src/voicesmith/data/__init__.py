"""Dataset intake: corpus formats -> validation report -> feature cache -> batches.

Names are imported on first use, so a DataLoader worker (spawn) that needs only the loader does
not import the validation and text front end with it.
"""

from __future__ import annotations

from importlib import import_module

_EXPORTS = {
    "CorpusItem": "formats", "Corpus": "formats", "Finding": "formats", "read_corpus": "formats",
    "ValidationReport": "report", "ItemResult": "report",
    "validate_corpus": "validate", "validate_command": "validate",
    "FeatureCache": "cache", "prepare": "cache", "prepare_command": "cache",
    "TTSDataset": "loader", "collate_batch": "loader", "build_dataloaders": "loader", "split_entries": "loader",
    "LengthBucketBatchSampler": "sampler", "padding_waste": "sampler",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'voicesmith.data' has no attribute {name!r}")
    return getattr(import_module(f"voicesmith.data.{_EXPORTS[name]}"), name)
