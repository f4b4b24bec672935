"""Loading: collate, length buckets (DDP too), the train/validation split, spawn workers."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from data_corpus_helpers import make_broken_corpus
from lightning.fabric.utilities.data import _set_sampler_epoch
from torch.utils.data import DataLoader

from voicesmith.audio import MEL_FLOOR
from voicesmith.config import DataConfig, VoiceConfig
from voicesmith.data.cache import prepare
from voicesmith.data.loader import TTSDataset, build_dataloaders, collate_batch, limit_entries, split_entries
from voicesmith.data.sampler import LengthBucketBatchSampler, padding_waste
from voicesmith.errors import DataError


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """The feature cache of a broken corpus (9 usable items of 23)."""
    root = tmp_path_factory.mktemp("loader")
    corpus = make_broken_corpus(root / "corpus", root / "speech")
    config = VoiceConfig(data=DataConfig(dataset=str(corpus), cache_dir=str(root / "cache"), num_workers=0,
                                         val_fraction=0.2))
    config.train.batch_size = 3
    return config, prepare(config, progress=False)


def _ids(loader) -> list[str]:
    return [item_id for batch in loader for item_id in batch["ids"]]


def test_loaders_use_exactly_the_usable_items(prepared):
    config, cache = prepared
    train, val = build_dataloaders(config, cache)
    train_ids, val_ids = _ids(train), _ids(val)
    assert len(train_ids) == len(set(train_ids)) and not set(train_ids) & set(val_ids)
    assert sorted(train_ids + val_ids) == sorted(item.id for item in cache.report.usable_items)
    assert len(val_ids) == 2  # round(9 * 0.2)
    assert _ids(val) == val_ids  # the validation loader is deterministic


def test_collate_pads_and_keeps_lengths(prepared):
    config, cache = prepared
    dataset = TTSDataset(cache.root, cache.entries, config.audio.hop_length)
    items = [dataset[i] for i in range(3)]
    batch = collate_batch(items)
    assert batch["ids"] == [entry["id"] for entry in cache.entries[:3]]
    assert batch["mel_lengths"].tolist() == [entry["n_frames"] for entry in cache.entries[:3]]
    assert torch.equal(batch["audio_lengths"], batch["mel_lengths"] * 256)
    assert batch["phoneme_lengths"].tolist() == [entry["n_ids"] for entry in cache.entries[:3]]
    longest = int(batch["mel_lengths"].max())
    assert batch["mels"].shape == (3, 80, longest) and batch["audio"].shape == (3, longest * 256)
    for row, item in enumerate(items):
        n, t = item["mel"].shape[-1], len(item["phoneme_ids"])
        assert torch.equal(batch["mels"][row, :, :n], item["mel"]) and (batch["mels"][row, :, n:] == MEL_FLOOR).all()
        assert (batch["audio"][row, n * 256:] == 0).all() and batch["audio"].abs().max() <= 1.0
        assert torch.equal(batch["phoneme_ids"][row, :t], item["phoneme_ids"]) and (batch["phoneme_ids"][row, t:] == 0).all()
    assert batch["speaker_ids"].dtype == torch.long and batch["phoneme_ids"].dtype == torch.long


def test_bucketed_batches_cover_every_item_once_with_little_padding():
    lengths = np.random.default_rng(0).integers(100, 900, size=1000)
    sampler = LengthBucketBatchSampler(lengths, batch_size=16, seed=3)
    batches = list(sampler)
    assert sorted(i for batch in batches for i in batch) == list(range(1000))
    assert all(len(batch) <= 16 for batch in batches)
    random_batches = np.array_split(np.random.default_rng(1).permutation(1000), 1000 // 16)
    assert padding_waste(batches, lengths) < 0.1 < padding_waste(random_batches, lengths)

    assert list(sampler) == batches  # same epoch, same batches
    _set_sampler_epoch(DataLoader(range(1000), batch_sampler=sampler), 1)  # what Lightning calls each epoch
    assert sampler.epoch == 1 and list(sampler) != batches
    capped = LengthBucketBatchSampler(lengths, batch_size=16, max_frames=3000)
    assert all(len(b) == 1 or max(lengths[b]) * len(b) <= 3000 for b in capped)
    assert sorted(i for batch in capped for i in batch) == list(range(1000))


@pytest.mark.parametrize("drop_last", [False, True])
def test_ddp_ranks_get_disjoint_items_and_equal_batch_counts(drop_last):
    lengths = np.random.default_rng(0).integers(100, 900, size=107)
    ranks = [LengthBucketBatchSampler(lengths, batch_size=8, seed=5, num_replicas=3, rank=rank, drop_last=drop_last)
             for rank in range(3)]
    for sampler in ranks:
        sampler.set_epoch(2)
    per_rank = [list(sampler) for sampler in ranks]
    assert len({len(batches) for batches in per_rank}) == 1 and len(ranks[0]) == len(per_rank[0])
    all_batches = ranks[0].all_batches()  # 13 batches of 8 and one of 3: one short of 5 rounds of 3 ranks
    assert len(all_batches) == 14
    seen = [i for batches in per_rank for batch in batches for i in batch]
    if drop_last:
        assert len(per_rank[0]) == 4 and len(seen) == len(set(seen))  # 2 batches left out
    else:
        assert len(per_rank[0]) == 5 and set(seen) == set(range(107))
        repeated = [tuple(b) for batches in per_rank for b in batches]
        assert len(repeated) - len(set(repeated)) == 1  # one batch repeated to fill the last round


def test_split_is_deterministic_stratified_and_limited():
    entries = [{"id": f"{speaker}_{i}", "speaker": speaker} for speaker, n in (("a", 60), ("b", 30), ("c", 10))
               for i in range(n)]
    train, val = split_entries(entries, val_fraction=0.1, val_max_items=64, seed=7)
    assert (train, val) == split_entries(list(entries), 0.1, 64, seed=7)
    assert sorted(train + val) == list(range(100)) and not set(train) & set(val)
    assert sorted(entries[i]["speaker"] for i in val) == ["a"] * 6 + ["b"] * 3 + ["c"]
    assert split_entries(entries, 0.1, 64, seed=8)[1] != val
    assert len(split_entries(entries, 0.5, 4, seed=7)[1]) == 4
    assert split_entries(entries[:1], 0.5, 4, seed=7) == ([0], [])  # one item: nothing to validate on

    quick = limit_entries(train, entries, max_samples=9, seed=7)
    assert len(quick) == 9 and set(quick) <= set(train)
    assert sorted(entries[i]["speaker"] for i in quick).count("a") in (5, 6)


def test_max_samples_and_stale_cache(prepared):
    config, cache = prepared
    train, _ = build_dataloaders(config, cache, max_samples=4)
    assert len(_ids(train)) == 4
    other = config.model_copy(deep=True)
    other.audio.hop_length = 128
    with pytest.raises(DataError, match="prepare"):
        build_dataloaders(other, cache)


def test_spawn_workers_iterate_a_whole_epoch(prepared):
    config, cache = prepared
    config = config.model_copy(deep=True)
    config.data.num_workers = 2
    train, _ = build_dataloaders(config, cache, multiprocessing_context="spawn")
    assert train.multiprocessing_context.get_start_method() == "spawn"
    first = _ids(train)
    train.batch_sampler.set_epoch(1)
    second = _ids(train)
    assert sorted(first) == sorted(second) == sorted(train.dataset[i]["id"] for i in range(len(train.dataset)))
    assert first != second  # set_epoch reached the sampler: a new shuffle
