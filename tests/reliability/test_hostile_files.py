"""Hostile files: a config whose YAML tags would run code is refused without running it (checkpoints
carrying code: tests/test_training_units.py)."""

from __future__ import annotations

import pytest

from voicesmith.config import load_config
from voicesmith.errors import ConfigError


def test_a_config_with_a_code_tag_is_refused_without_running_it(tmp_path):
    marker = tmp_path / "pwned"
    path = tmp_path / "config.yaml"
    path.write_text(f'data:\n  dataset: !!python/object/apply:os.system ["touch {marker}"]\n', encoding="utf-8")
    with pytest.raises(ConfigError, match=r"config.yaml is not valid YAML: .*python/object/apply:os.system"):
        load_config(path)
    assert not marker.exists()
