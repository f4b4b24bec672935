"""Platforms: spawned data workers, a foreign working directory, and paths with spaces and non-ASCII
characters, in the corpus and in the run directory, through prepare, train, resume and synthesis."""

from __future__ import annotations

import multiprocessing
import shutil

import pytest

from voicesmith.training import train


@pytest.mark.slow
def test_spawned_workers_foreign_cwd_spaces_and_non_ascii_paths(make_run, demo_corpus, tmp_path, monkeypatch):
    from voicesmith.inference import Synthesizer

    corpus = shutil.copytree(demo_corpus, tmp_path / "corpus with spaces ñ 声")
    config = make_run(f"data.dataset={corpus}", "data.num_workers=2", "train.checkpoint_every_n_steps=2",
                      name="run dir é ü 音", own_cache=True)
    elsewhere = tmp_path / "somewhere else"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    previous = multiprocessing.get_start_method(allow_none=True)
    multiprocessing.set_start_method("spawn", force=True)
    try:
        assert train(config, max_steps=2)["global_step"] == 2
        summary = train(config, max_steps=3)
    finally:
        multiprocessing.set_start_method(previous, force=True)
    assert (summary["start_step"], summary["global_step"]) == (2, 3)
    assert list(elsewhere.iterdir()) == []  # nothing written to the working directory
    audio, rate = Synthesizer.load(config.run_dir).synthesize("Hello there.")
    assert rate == config.audio.sample_rate and len(audio) > 0
