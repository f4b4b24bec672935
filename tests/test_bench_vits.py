"""The VITS peer benchmark (benchmarks/bench_vits.py) compares like with like: at its peer configuration
voicesmith's VITS has exactly Piper's generator and the peers' discriminator, and it times the same steps."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_vits.py"
PIPER_PARAMS_G = 5_997_776  # peer_vits/README.md: piper-tts 1.8.0 at this configuration, 256 symbols
PEERS_PARAMS_D = 46_747_132  # the same in coqui-tts and piper


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_vits", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_peer_configuration_has_the_peers_sizes(bench, demo_corpus, tmp_path):
    from voicesmith.models.vits.model import build_vits_model

    config = bench.build_config(demo_corpus, tmp_path / "run", "tiny", 8, bench.PEER_CONFIG)
    assert (config.train.batch_size, config.hardware.precision, config.data.trim_silence) == (8, "32", False)
    assert config.audio.f_max is None and config.model.segment_frames * config.audio.hop_length == 8192
    model = build_vits_model(config.model, config.audio, n_symbols=256)
    counts = model.parameter_counts()
    assert (counts["generator"], counts["discriminator"]) == (PIPER_PARAMS_G, PEERS_PARAMS_D)


def test_times_steps_5_to_25_of_26_like_the_peers(bench):
    per_step = list(range(2, 27))  # values of steps 2..26, as intervals between 26 step ends give them
    selected = sorted(per_step[bench.FIRST_TIMED_STEP - 2:26 - 2])
    assert (selected[0], selected[-1], len(selected)) == (5, 25, 21)
    assert bench.timed_median(per_step, 26) == 15


def test_reads_peer_lines_and_states_the_verdict(bench):
    line = "PEER piper-vits sec_per_step=3.943 params_g=5997776 params_d=46747132 batch=8 peak_rss_mb=4726"
    match = bench.PEER_LINE.search("noise\n" + line + "\n")
    assert (match["name"], float(match["sec"]), int(match["rss"])) == ("piper-vits", 3.943, 4726)
    load = {"load_mean": 2.0, "load_max": 2.5}
    results = [{"name": "coqui-vits", "sec_per_step": 4.0, "params_g": 1, "params_d": 1, "peak_rss_mb": 3000, **load},
               {"name": "piper-vits", "sec_per_step": 3.0, "params_g": 1, "params_d": 1, "peak_rss_mb": 4000, **load},
               {"name": "voicesmith-vits", "sec_per_step": 2.0, "params_g": 1, "params_d": 1, "peak_rss_mb": 2700,
                **load}]
    rows, verdict = bench.round_rows(results)
    assert len(rows) == 3
    assert "**1.50x** the faster peer (piper-vits" in verdict and ": met)" in verdict
    assert "**0.90x** the lower peer (coqui-vits" in verdict and "missed" in verdict
