"""Disk faults: ENOSPC while writing a checkpoint or a cache entry leaves the previous checkpoint and the
rest of the cache intact and says what to free; a damaged cache entry is detected by its checksum and
rebuilt, never fed to the model."""

from __future__ import annotations

import errno
import io
import logging

import pytest
import torch
from reliability_helpers import read_summary

from voicesmith import fileio
from voicesmith.checkpoint import load_checkpoint
from voicesmith.config import DataConfig, VoiceConfig, load_config
from voicesmith.data.cache import FeatureBuilder, prepare
from voicesmith.data.loader import TTSDataset
from voicesmith.errors import DataError, DiskFull
from voicesmith.training import train


class FullDisk(io.FileIO):
    """A file on a disk that fills up after `room` bytes: the next write raises ENOSPC, as write(2) does."""

    room = 4096

    def write(self, data) -> int:
        if self.tell() + len(data) > self.room:
            raise OSError(errno.ENOSPC, "No space left on device")
        return super().write(data)


def fill_disk_for(monkeypatch, marker: str) -> list[str]:
    """Every atomic write whose file name contains `marker` hits a full disk; returns the names tried."""
    tried = []

    def opener(path, mode="r", *args, **kwargs):
        if marker in str(path):
            tried.append(str(path))
            return FullDisk(path, mode.replace("b", ""))
        return open(path, mode, *args, **kwargs)

    monkeypatch.setattr(fileio, "open", opener, raising=False)  # fileio's own `open`: what atomic_write uses
    return tried


def test_enospc_while_writing_a_checkpoint_keeps_the_previous_one(make_run, monkeypatch):
    config = make_run("train.checkpoint_every_n_steps=2", "train.keep_last_k=1")
    assert train(config, max_steps=2)["global_step"] == 2
    folder = config.run_dir / "checkpoints"
    before = {name: (folder / name).read_bytes() for name in ("last.ckpt", "step-2.ckpt")}

    tried = fill_disk_for(monkeypatch, ".ckpt.tmp-")
    with pytest.raises(DiskFull, match=r"The disk is full: .*step-4\.ckpt could not be written \(\d+ MB free .*"
                                       r"older checkpoints in .*lower train.keep_last_k"):
        train(config, max_steps=6)
    assert tried  # the injected fault was met
    assert {name: (folder / name).read_bytes() for name in before} == before  # untouched, still readable
    assert load_checkpoint(folder / "last.ckpt")["global_step"] == 2
    assert sorted(path.name for path in folder.iterdir()) == ["last.ckpt", "step-2.ckpt"]  # no temporary left
    summary = read_summary(config.run_dir)
    assert summary["status"] == "failed" and "The disk is full" in summary["reason"]

    monkeypatch.undo()  # room again: the same command continues from step 2
    summary = train(config, max_steps=6)
    assert (summary["start_step"], summary["global_step"]) == (2, 6)


@pytest.fixture
def prepared(tmp_path, demo_corpus):
    """A run with its own freshly prepared 24-item cache."""
    VoiceConfig(data=DataConfig(dataset=str(demo_corpus))).save(tmp_path / "run" / "config.yaml")
    config = load_config(tmp_path / "run" / "config.yaml")
    return config, prepare(config, progress=False)


def test_enospc_while_writing_cache_entries_keeps_the_rest_of_the_cache(prepared, monkeypatch):
    config, cache = prepared
    features = {entry["file"]: (cache.root / entry["file"]).read_bytes() for entry in cache.entries}
    manifest = (cache.root / "manifest.json").read_bytes()
    lost = cache.entries[:3]
    for entry in lost:
        (cache.root / entry["file"]).unlink()

    tried = fill_disk_for(monkeypatch, ".pt.tmp-")
    with pytest.raises(DiskFull, match=r"could not be written .*set data.cache_dir to a folder on a larger disk"):
        prepare(config, progress=False)
    assert len(tried) == 1  # the first full write stops preparation: no item is excluded for want of space
    kept = {entry["file"] for entry in cache.entries[3:]}
    assert all((cache.root / name).read_bytes() == features[name] for name in kept)
    assert (cache.root / "manifest.json").read_bytes() == manifest
    assert not [path for path in (cache.root / "features").rglob("*") if ".tmp-" in path.name]

    monkeypatch.undo()
    again = prepare(config, progress=False)
    assert again.stats == {"built": 3, "reused": 21, "failed": 0}
    assert all((cache.root / entry["file"]).read_bytes() == features[entry["file"]] for entry in lost)


def test_a_corrupt_cache_entry_is_detected_and_rebuilt_never_fed(prepared, caplog):
    config, cache = prepared
    entry = cache.entries[5]
    path = cache.root / entry["file"]
    good = path.read_bytes()
    expected = torch.load(path, weights_only=True)
    damaged = bytearray(good)
    damaged[len(damaged) // 2] ^= 0xFF  # one flipped byte inside the mel: torch.load alone would not notice
    path.write_bytes(bytes(damaged))

    unguarded = TTSDataset(cache.root, [entry], config.audio.hop_length)  # no builder: refused, not fed
    with pytest.raises(DataError, match=rf"item {entry['id']} .*checksum mismatch.*voicesmith prepare"):
        unguarded[0]
    dataset = TTSDataset(cache.root, [entry], config.audio.hop_length, FeatureBuilder(config.audio, config.data))
    with caplog.at_level(logging.WARNING):
        item = dataset[0]
    assert f"The cached features of item {entry['id']}" in caplog.text and "rebuilt" in caplog.text
    assert torch.equal(item["mel"], expected["mel"]) and path.read_bytes() == good  # the same bytes as before

    path.write_bytes(good[: len(good) // 2])  # cut off: found by prepare from its size alone
    assert prepare(config, progress=False).stats == {"built": 1, "reused": 23, "failed": 0}
    assert path.read_bytes() == good


def test_a_corrupt_speakers_json_is_an_error_naming_the_file(tmp_path, multispeaker_corpus):
    VoiceConfig(data=DataConfig(dataset=str(multispeaker_corpus))).save(tmp_path / "run" / "config.yaml")
    config = load_config(tmp_path / "run" / "config.yaml")
    speakers = prepare(config, progress=False).speakers
    assert len(speakers) == 3
    path = tmp_path / "run" / "cache" / "speakers.json"
    for damage in ('{"p1": 0, "p2": ', '{"p1": 0, "p2": 0, "p3": 7}'):
        path.write_text(damage)
        with pytest.raises(DataError, match=rf"The speaker map {path} .*restore it .* delete it"):
            prepare(config, progress=False)
