"""Hostile files: a config whose YAML tags would run code is refused without running it (checkpoints
carrying code: tests/test_training_units.py)."""

from __future__ import annotations

import numpy as np
import pytest
import soundfile as sf

from voicesmith.config import load_config, make_config
from voicesmith.errors import ConfigError


def test_a_config_with_a_code_tag_is_refused_without_running_it(tmp_path):
    marker = tmp_path / "pwned"
    path = tmp_path / "config.yaml"
    path.write_text(f'data:\n  dataset: !!python/object/apply:os.system ["touch {marker}"]\n', encoding="utf-8")
    with pytest.raises(ConfigError, match=r"config.yaml is not valid YAML: .*python/object/apply:os.system"):
        load_config(path)
    assert not marker.exists()


def _wav_with_claimed_size(path, real_samples: int, claimed_bytes: int, rate: int = 22050) -> None:
    """A 16-bit mono WAV whose header claims `claimed_bytes` of data while the file holds `real_samples`."""
    import struct

    header = (b"RIFF" + struct.pack("<I", 36 + claimed_bytes) + b"WAVE" + b"fmt "
              + struct.pack("<IHHIIHH", 16, 1, 1, rate, rate * 2, 2, 16) + b"data" + struct.pack("<I", claimed_bytes))
    path.write_bytes(header + np.zeros(real_samples, dtype=np.int16).tobytes())


def test_huge_and_forged_audio_headers_are_judged_without_decoding_them(tmp_path, monkeypatch):
    import voicesmith.data.validate as validate

    wavs = tmp_path / "corpus" / "wavs"
    wavs.mkdir(parents=True)
    sf.write(wavs / "long.wav", np.zeros(22050 * 70, dtype=np.float32), 22050, subtype="PCM_16")  # 70 s
    _wav_with_claimed_size(wavs / "forged.wav", 22050, 2_000_000_000)  # claims 12 hours, holds 1 s
    (tmp_path / "corpus" / "metadata.csv").write_text("long|A very long take.\nforged|A forged header.\n",
                                                      encoding="utf-8")
    decoded = []
    real_condition = validate.condition_audio
    monkeypatch.setattr(validate, "condition_audio", lambda path, *a: decoded.append(path.name) or
                        real_condition(path, *a))
    config = make_config(str(tmp_path / "corpus"), "tiny")
    config.data.max_seconds = 20.0
    report = validate.validate_corpus(tmp_path / "corpus", config, cache=False, workers=0)
    kinds = {finding.id: finding.kind for finding in report.findings if finding.severity == "error"}
    assert kinds["long"] == "too_long" and "not decoded" in next(f.message for f in report.findings if f.id == "long")
    assert "long.wav" not in decoded  # refused from its header alone
    assert kinds["forged"] == "silence"  # libsndfile reads what the file really holds: 1 s of zeros
    assert report.items_usable == 0 and report.items_total == 2
