"""Feature cache: consistent features, incremental rebuilds, failures reported, never lost."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import soundfile as sf
import torch
from data_corpus_helpers import make_broken_corpus

from voicesmith.audio import mel_spectrogram
from voicesmith.config import DataConfig, VoiceConfig, load_config
from voicesmith.data import cache as cache_module
from voicesmith.data.cache import FeatureCache, prepare, prepare_command
from voicesmith.data.validate import validate_corpus
from voicesmith.demo_corpus import write_demo_corpus
from voicesmith.errors import DataError
from voicesmith.text import SymbolTable, TextFrontend


@pytest.fixture
def run(tmp_path):
    """A run folder whose config names a fresh 12-item corpus by a relative path."""
    write_demo_corpus(tmp_path / "corpus", n=12)
    VoiceConfig(data=DataConfig(dataset="../corpus")).save(tmp_path / "run" / "config.yaml")
    return tmp_path / "run"


def _load(cache: FeatureCache, entry: dict) -> dict:
    return torch.load(cache.root / entry["file"], weights_only=True)


def test_prepare_writes_consistent_features(run):
    config = load_config(run / "config.yaml")
    cache = prepare(config, progress=False)

    assert cache.root == run / "cache" and len(cache) == 12 and cache.stats["built"] == 12
    frontend = TextFrontend(config.text, SymbolTable.default())
    for entry in cache.entries:
        features = _load(cache, entry)
        mel, audio = features["mel"], features["audio"]
        assert mel.dtype == torch.float32 and mel.shape == (80, entry["n_frames"])
        assert audio.dtype == torch.int16 and audio.shape == (entry["n_frames"] * 256,)
        assert torch.equal(mel, mel_spectrogram(audio.float() / 32767.0, config.audio))
        assert abs(audio.abs().max().item() / 32767.0 - 0.95) < 1e-3  # level-normalised
        assert entry["ids"] == frontend.encode(entry["text"]).ids and entry["n_ids"] <= entry["n_frames"]
    assert SymbolTable.load(run / "cache" / "symbols.json") == SymbolTable.default()
    assert json.loads((run / "cache" / "speakers.json").read_text()) == {}
    report = json.loads((run / "data_report.json").read_text(encoding="utf-8"))
    assert (report["items_total"], report["items_usable"]) == (12, 12)
    reopened = FeatureCache.load(run / "cache")
    assert reopened.entries == cache.entries and reopened.n_speakers == 1


def test_only_what_changed_is_rebuilt(run):
    config = load_config(run / "config.yaml")
    first = prepare(config, progress=False)
    files = {entry["id"]: entry["file"] for entry in first.entries}
    assert prepare(config, progress=False).stats == {"built": 0, "reused": 12, "failed": 0}

    metadata = run.parent / "corpus" / "metadata.csv"
    lines = metadata.read_text(encoding="utf-8").splitlines()
    lines[0] = "demo-0001|The quick brown cat jumps over the lazy dog.|The quick brown cat jumps over the lazy dog."
    metadata.write_text("\n".join(lines) + "\n", encoding="utf-8")
    audio, rate = sf.read(run.parent / "corpus" / "wavs" / "demo-0002.wav", dtype="float32")
    sf.write(run.parent / "corpus" / "wavs" / "demo-0002.wav", audio * 0.5, rate)
    second = prepare(config, progress=False)
    assert second.stats == {"built": 1, "reused": 11, "failed": 0}  # the new text needs no new features
    changed = {entry["id"] for entry in second.entries if entry["file"] != files[entry["id"]]}
    assert changed == {"demo-0002"}
    assert second.entries[0]["text"] == "The quick brown cat jumps over the lazy dog." and second.entries[0]["ids"] != first.entries[0]["ids"]

    hop = load_config(run / "config.yaml", ["audio.hop_length=128"])
    third = prepare(hop, progress=False)
    assert third.stats["built"] == 12
    assert [p.name for p in (run / "cache" / "features").iterdir()] == [third.audio_key]  # old features pruned
    assert all(entry["n_frames"] in range(2 * old["n_frames"], 2 * old["n_frames"] + 2)
               for entry, old in zip(third.entries, second.entries))


def test_exactly_the_usable_items_are_prepared(tmp_path):
    corpus = make_broken_corpus(tmp_path / "corpus", tmp_path / "speech")
    config = VoiceConfig(data=DataConfig(dataset=str(corpus), cache_dir=str(tmp_path / "cache")))
    cache = prepare(config, progress=False)
    report = cache.report
    assert [entry["id"] for entry in cache.entries] == [item.id for item in report.usable_items]
    assert report.items_total == report.items_usable + report.items_excluded == 23
    saved = json.loads((tmp_path / "cache" / "data_report.json").read_text(encoding="utf-8"))
    assert len({(e["id"], e["line"]) for e in saved["items"] if e["excluded"]}) == report.items_excluded
    rate44k = next(entry for entry in cache.entries if entry["id"] == "rate44k")
    assert _load(cache, rate44k)["audio"].shape == (rate44k["n_frames"] * 256,)  # resampled to 22050 Hz


def test_an_item_that_breaks_after_validation_is_reported_not_lost(run, capsys):
    config = load_config(run / "config.yaml")
    report = validate_corpus(config.resolve(config.data.dataset), config, cache=False)
    broken = run.parent / "corpus" / "wavs" / "demo-0003.wav"
    audio, rate = sf.read(broken, dtype="float32")
    audio[100] = np.nan
    sf.write(broken, audio, rate, subtype="FLOAT")

    cache = prepare(config, report=report, progress=False)
    assert cache.stats == {"built": 11, "reused": 0, "failed": 1}
    assert "demo-0003" not in {entry["id"] for entry in cache.entries}
    saved = json.loads((run / "data_report.json").read_text(encoding="utf-8"))
    assert (saved["items_total"], saved["items_usable"]) == (12, 11)
    [finding] = [e for e in saved["items"] if e["id"] == "demo-0003"]
    assert finding["kind"] == "prepare_failed" and finding["excluded"] and "validate again" in finding["message"]


def test_no_usable_item_raises_with_the_top_reasons(tmp_path):
    (tmp_path / "corpus" / "wavs").mkdir(parents=True)
    sf.write(tmp_path / "corpus" / "wavs" / "a.wav", np.zeros(22050, dtype=np.float32), 22050)
    (tmp_path / "corpus" / "metadata.csv").write_text("a|Silent.\nb|Missing.\n", encoding="utf-8")
    VoiceConfig(data=DataConfig(dataset="../corpus")).save(tmp_path / "run" / "config.yaml")
    with pytest.raises(DataError, match=r"(?s)No usable item.*silence: 1 item.*missing_audio: 1 item") as error:
        prepare_command(tmp_path / "run" / "config.yaml", [])
    assert error.value.exit_code == 2
    assert json.loads((tmp_path / "run" / "data_report.json").read_text())["items_usable"] == 0


def test_prepare_command_summary(run, capsys):
    assert prepare_command(run / "config.yaml", ["data.min_seconds=2.5"]) == 0
    out = capsys.readouterr().out
    assert "12 items" in out and "Feature cache" in out and "built" in out


def test_speakers_and_worker_processes(multispeaker_corpus, tmp_path, monkeypatch):
    config = VoiceConfig(data=DataConfig(dataset=str(multispeaker_corpus), cache_dir=str(tmp_path / "serial")))
    report = validate_corpus(multispeaker_corpus, config, cache=False)  # no cache written into the fixture
    serial = prepare(config, report=report, progress=False, workers=1)
    assert serial.speakers == {"spk0": 0, "spk1": 1, "spk2": 2} and serial.n_speakers == 3
    assert all(entry["speaker_id"] == int(entry["speaker"][3:]) for entry in serial.entries)

    monkeypatch.setattr(cache_module, "PARALLEL_MIN_ITEMS", 1)
    config.data.cache_dir = str(tmp_path / "workers")
    in_workers = prepare(config, report=report, progress=False, workers=2)
    assert in_workers.stats["built"] == 24
    for a, b in zip(serial.entries, in_workers.entries):
        assert {k: v for k, v in a.items() if k != "file"} == {k: v for k, v in b.items() if k != "file"}
        assert torch.equal(_load(serial, a)["mel"], _load(in_workers, b)["mel"])


def test_character_table_is_kept_when_the_corpus_grows(tmp_path):
    corpus = write_demo_corpus(tmp_path / "corpus", n=4)
    config = VoiceConfig(data=DataConfig(dataset=str(corpus), cache_dir=str(tmp_path / "cache")))
    config.text.phonemizer = "characters"
    first = prepare(config, progress=False)
    assert first.symbols.kind == "characters"
    with open(corpus / "metadata.csv", "a", encoding="utf-8") as metadata:
        metadata.write("demo-0004x|Zoë's naïve café — quizzical!|Zoë's naïve café — quizzical!\n")
    shutil.copy(corpus / "wavs" / "demo-0004.wav", corpus / "wavs" / "demo-0004x.wav")
    second = prepare(config, progress=False)
    assert second.symbols == first.symbols and len(second) == 5
    assert any(f.kind == "unknown_symbols" and f.id == "demo-0004x" for f in second.report.findings)
