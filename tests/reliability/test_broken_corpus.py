"""Every broken-corpus kind, mixed with good items, through validate, prepare and train: no crash, and
exact accounting (each item used or excluded with its reason; used + excluded = total)."""

from __future__ import annotations

import json

from data_corpus_helpers import DUPLICATE_LINE, EXPECTED, make_broken_corpus

from voicesmith.training import train


def test_a_broken_corpus_trains_on_exactly_its_usable_items(make_run, tmp_path):
    corpus = make_broken_corpus(tmp_path / "corpus", tmp_path / "speech")
    config = make_run(f"data.dataset={corpus}", "data.max_samples=null", own_cache=True)
    summary = train(config, max_steps=2)
    assert summary["status"] == "completed" and summary["global_step"] == 2

    report = json.loads((config.run_dir / "data_report.json").read_text())
    usable = {item_id for item_id, (error, _) in EXPECTED.items() if error is None}
    excluded = {finding["id"]: finding["kind"] for finding in report["items"] if finding["excluded"]}
    expected_errors = {item_id: error for item_id, (error, _) in EXPECTED.items() if error is not None}
    assert {item_id: kind for item_id, kind in excluded.items() if item_id in expected_errors} == expected_errors
    assert any(finding["line"] == DUPLICATE_LINE and finding["excluded"] for finding in report["items"])
    assert report["items_total"] == len(EXPECTED) + 1 and report["items_usable"] == len(usable)
    assert summary["items_used"] == len(usable) and summary["items_excluded"] == len(EXPECTED) + 1 - len(usable)
    assert summary["items_used"] + summary["items_excluded"] == report["items_total"]
