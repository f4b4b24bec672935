"""`voicesmith demo`: the README's first command, end to end, at a size a test can afford."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import soundfile as sf


def test_demo_makes_a_corpus_trains_writes_samples_and_resumes(tmp_path: Path):
    command = [sys.executable, "-m", "voicesmith.cli", "demo", "--out", str(tmp_path / "demo"), "--n", "16",
               "--max-steps", "4"]
    first = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert first.returncode == 0, first.stderr[-3000:]
    run_dir = tmp_path / "demo" / "run"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["global_step"] == 4
    assert summary["items_used"] + summary["items_excluded"] == 16
    assert (run_dir / "checkpoints" / "last.ckpt").is_file() and (run_dir / "data_report.json").is_file()
    wavs = sorted((run_dir / "samples").rglob("*.wav"))
    assert wavs and all(sf.info(wav).samplerate == 22050 for wav in wavs)
    for line in ("run:", "samples:", "TensorBoard:", "voicesmith synth"):
        assert line in first.stdout

    # Running it again resumes the same run instead of starting over.
    command[command.index("--max-steps") + 1] = "6"
    second = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert second.returncode == 0, second.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["start_step"] == 4 and summary["global_step"] == 6
