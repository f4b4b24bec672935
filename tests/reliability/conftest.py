"""Runs for the reliability checks: the tiny preset on the demo corpus, with one shared feature cache."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/: the shared corpus helpers

from reliability_helpers import QUICK  # noqa: E402


@pytest.fixture(scope="session")
def reliability_cache(tmp_path_factory) -> Path:
    """One feature cache for the in-process runs (prepared by the first run)."""
    return tmp_path_factory.mktemp("reliability_cache") / "cache"


@pytest.fixture
def make_run(demo_corpus, reliability_cache, tmp_path):
    """make_run(*overrides, name=..., own_cache=False) -> VoiceConfig saved as tmp_path/name/config.yaml."""
    from voicesmith.config import apply_override, preset_dict, validate_config

    def make(*overrides: str, name: str = "run", own_cache: bool = False):
        raw = preset_dict("tiny", str(demo_corpus))
        cache = [] if own_cache else [f"data.cache_dir={reliability_cache}"]
        for item in [*cache, *QUICK, *overrides]:
            apply_override(raw, item)
        config = validate_config(raw, source="test")
        config.save(tmp_path / name / "config.yaml")
        return config

    return make
