"""Run configs for tests: a preset, the test's overrides, saved where the run lives."""

from __future__ import annotations

from pathlib import Path

from voicesmith.config import VoiceConfig, apply_override, preset_dict, validate_config


def write_run_config(run_dir: Path, corpus: Path, overrides: list[str], preset: str = "tiny",
                     model_type: str = "acoustic") -> VoiceConfig:
    """RUN_DIR/config.yaml for `corpus` from a preset and `--set`-style overrides; the loaded config."""
    raw = preset_dict(preset, str(corpus), model_type)
    for item in overrides:
        apply_override(raw, item)
    config = validate_config(raw, source="test")
    config.save(run_dir / "config.yaml")
    return config
