"""Validation: a corpus with every defect, asserted item by item; exit codes, cache, parallel checks."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest
import soundfile as sf
from data_corpus_helpers import DUPLICATE_LINE, EXPECTED, make_broken_corpus

from voicesmith.config import DataConfig, TextConfig, VoiceConfig
from voicesmith.data import validate
from voicesmith.data.parallel import run_parallel
from voicesmith.data.validate import validate_command, validate_corpus
from voicesmith.text import SymbolTable


@pytest.fixture(scope="module")
def broken_corpus(tmp_path_factory):
    return make_broken_corpus(tmp_path_factory.mktemp("broken"), tmp_path_factory.mktemp("speech"))


def _config(dataset, **data) -> VoiceConfig:
    return VoiceConfig(data=DataConfig(dataset=str(dataset), **data))


def _verdicts(report) -> dict:
    """id -> (error kinds, warning kinds) of the first item with that id (duplicates checked apart)."""
    verdicts = {}
    for result in report.results:
        if result.line == DUPLICATE_LINE:
            continue
        errors = {f.kind for f in result.findings if f.severity == "error"}
        warnings = {f.kind for f in result.findings if f.severity == "warning"}
        verdicts[result.id] = (errors, warnings)
    return verdicts


def test_every_defect_is_reported_item_by_item(broken_corpus):
    report = validate_corpus(broken_corpus, _config(broken_corpus), cache=False)

    verdicts = _verdicts(report)
    assert set(verdicts) == set(EXPECTED)
    for item_id, (error, warnings) in EXPECTED.items():
        errors, found_warnings = verdicts[item_id]
        assert errors == ({error} if error else set()), item_id
        assert found_warnings == warnings, item_id
    [duplicate] = [r for r in report.results if r.line == DUPLICATE_LINE]
    assert (duplicate.id, [f.kind for f in duplicate.findings]) == ("good-1", ["duplicate_id"])

    usable = {item.id for item in report.usable_items}
    assert usable == {item_id for item_id, (error, _) in EXPECTED.items() if error is None}
    assert report.items_total == len(EXPECTED) + 1 == report.items_usable + report.items_excluded
    assert report.seconds_usable > 9 * 2.0


def test_report_follows_the_design_format(broken_corpus, tmp_path):
    report = validate_corpus(broken_corpus, _config(broken_corpus), cache=False)
    saved = json.loads(report.save(tmp_path / "report.json").read_text(encoding="utf-8"))

    assert saved["dataset"] == str(broken_corpus)
    assert (saved["items_total"], saved["items_usable"]) == (report.items_total, report.items_usable)
    for entry in saved["items"]:
        assert set(entry) == {"id", "line", "severity", "kind", "message", "excluded"}
        assert entry["severity"] in ("error", "warning") and entry["message"]
        assert entry["excluded"] == (entry["id"] not in {i.id for i in report.usable_items}
                                     or entry["line"] == DUPLICATE_LINE)
    excluded_named = {(e["id"], e["line"]) for e in saved["items"] if e["excluded"]}
    assert len(excluded_named) == saved["items_total"] - saved["items_usable"]  # every excluded item named
    assert sum(row["items"] for row in saved["duration_histogram"]) == saved["items_usable"]
    assert saved["counts"]["empty_file"] == 2


def test_validate_command_prints_summary_and_exit_codes(broken_corpus, tmp_path, capsys):
    assert validate_command(broken_corpus, tmp_path / "report.json") == 0
    out = capsys.readouterr().out
    assert "23 items, 9 usable" in out and "too_many_phonemes" in out and "Duration of usable items" in out
    assert json.loads((tmp_path / "report.json").read_text(encoding="utf-8"))["items_usable"] == 9

    hopeless = tmp_path / "hopeless"
    shutil.copytree(broken_corpus / "wavs", hopeless / "wavs")
    (hopeless / "metadata.csv").write_text("silence|Quiet.\nmissing|Gone.\nempty|Nothing.\n", encoding="utf-8")
    assert validate_command(hopeless, tmp_path / "hopeless.json") == 2
    err = capsys.readouterr().err
    assert "No usable item" in err and "silence: 1 item(s)" in err and "missing_audio" in err


def test_limits_come_from_the_config(broken_corpus, tmp_path):
    config = _config(broken_corpus, min_seconds=3.0)
    config.save(tmp_path / "config.yaml")
    short = {r.id for r in validate_corpus(broken_corpus, config, cache=False).results
             if any(f.kind == "too_short" for f in r.findings)}
    assert {"short", "good-2"} <= short  # good-2 is about 2.3 s long
    assert validate_command(broken_corpus, None, config_path=tmp_path / "config.yaml") == 0


def test_phoneme_check_uses_the_real_hop_length(broken_corpus):
    # good-1 holds about 3 s: 260 frames at hop 256, but only 16 at hop 4096 (fewer than its ids)
    config = _config(broken_corpus)
    config.audio.hop_length = 4096
    verdicts = _verdicts(validate_corpus(broken_corpus, config, cache=False))
    assert verdicts["good-1"][0] == {"too_many_phonemes"}


def test_second_run_is_served_from_the_cache(broken_corpus, tmp_path, monkeypatch):
    corpus = tmp_path / "corpus"
    shutil.copytree(broken_corpus, corpus)
    config = _config(corpus)
    first = validate_corpus(corpus, config, cache=tmp_path / "cache").to_dict()

    checked = []
    monkeypatch.setattr(validate.ItemChecker, "check_many",
                        lambda self, items: checked.extend(i.id for i in items) or [self.check(i) for i in items])
    second = validate_corpus(corpus, config, cache=tmp_path / "cache").to_dict()
    assert checked == [] and second == first

    audio, rate = sf.read(corpus / "wavs" / "good-2.wav", dtype="float32")
    sf.write(corpus / "wavs" / "good-2.wav", np.zeros_like(audio), rate)  # the file changes: checked again
    third = validate_corpus(corpus, config, cache=tmp_path / "cache")
    assert checked == ["good-2"]
    assert _verdicts(third)["good-2"][0] == {"silence"}

    config.data.min_seconds = 3.0  # a setting that changes verdicts: everything is checked again
    validate_corpus(corpus, config, cache=tmp_path / "cache")
    assert len(checked) == 1 + 20  # every parsed item: 23 lines less badutf8, line-20 and the duplicate


def test_cache_location_falls_back_and_never_crashes(demo_corpus, tmp_path, monkeypatch):
    corpus = tmp_path / "corpus"
    shutil.copytree(demo_corpus, corpus, ignore=shutil.ignore_patterns(".voicesmith-cache"))
    (corpus / ".voicesmith-cache").write_text("a file where the cache folder would go", encoding="utf-8")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "user-cache"))
    report = validate_corpus(corpus, _config(corpus))
    assert report.items_usable == 24
    assert list((tmp_path / "user-cache" / "voicesmith" / "validation").glob("*.json"))

    (tmp_path / "blocked").write_text("not a folder", encoding="utf-8")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "blocked"))
    assert validate_corpus(corpus, _config(corpus, min_seconds=1.0)).items_usable == 24  # no cache, no crash


def test_unknown_symbols_are_a_warning(tmp_path, demo_corpus):
    config = _config(demo_corpus)
    config.text = TextConfig(phonemizer="characters")
    table = SymbolTable.for_characters(["a e i o u"])  # a table made from other texts: consonants unknown
    report = validate_corpus(demo_corpus, config, symbols=table, cache=False)
    assert report.items_usable == 24  # a warning keeps the item
    warned = [f for f in report.findings if f.kind == "unknown_symbols"]
    assert len(warned) == 24 and all(f.severity == "warning" for f in warned)
    for finding in warned:
        listed = set(finding.message.split(": ", 1)[1].split(". ")[0].split())
        assert listed and not listed & set("aeiou") and listed <= set("bcdfghjklmnpqrstvwxyzBCDFGHJKLMNPQRSTVWXYZ")


def test_worker_processes_give_the_same_report(broken_corpus, monkeypatch):
    monkeypatch.setattr(validate, "PARALLEL_MIN_ITEMS", 1)
    config = _config(broken_corpus)
    in_workers = validate_corpus(broken_corpus, config, workers=2, cache=False).to_dict()
    in_process = validate_corpus(broken_corpus, config, workers=1, cache=False).to_dict()
    assert in_workers == in_process


def _die_on_poison(state, chunk):
    """A worker function that takes its process down, as a crashing decoder would."""
    if "poison" in chunk:
        os._exit(3)
    return [f"{state}:{item}" for item in chunk]


def test_a_dying_worker_loses_no_item():
    items = [f"item-{i}" for i in range(40)] + ["poison"]
    results = run_parallel(_die_on_poison, items, "ok", lambda item: f"crashed:{item}", min_items=1, workers=2)
    assert len(results) == len(items)
    assert results[-1] == "crashed:poison"
    assert all(r in (f"ok:{item}", f"crashed:{item}") for r, item in zip(results, items))
