"""Config: round trip, path resolution from anywhere, overrides, and every bad-config case."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from voicesmith.config import init_run, load_config, make_config
from voicesmith.errors import ConfigError


@pytest.fixture
def run_config(tmp_path: Path) -> Path:
    (tmp_path / "corpus").mkdir()
    return init_run(tmp_path / "corpus", tmp_path / "runs" / "voice", preset="tiny")


def test_init_writes_dataset_relative_to_the_config(run_config: Path):
    raw = yaml.safe_load(run_config.read_text())
    assert raw["data"]["dataset"] == os.path.join("..", "..", "corpus")
    assert raw["preset"] == "tiny" and raw["model"]["type"] == "acoustic"


def test_round_trip_keeps_every_value(run_config: Path, tmp_path: Path):
    config = load_config(run_config, overrides=["train.batch_size=3", "samples.texts=[Hi there.]"])
    copy_path = config.save(tmp_path / "copy" / "config.yaml")
    again = load_config(copy_path)
    assert again.to_dict() == config.to_dict()
    assert again.train.batch_size == 3 and again.samples.texts == ["Hi there."]


def test_paths_resolve_against_the_config_file_from_a_foreign_directory(run_config: Path, tmp_path: Path,
                                                                         monkeypatch):
    elsewhere = tmp_path / "somewhere" / "else"
    elsewhere.mkdir(parents=True)
    monkeypatch.chdir(elsewhere)
    config = load_config(os.path.relpath(run_config, elsewhere))
    assert config.resolve(config.data.dataset) == (tmp_path / "corpus").resolve()
    assert config.resolve(config.data.cache_dir) == (run_config.parent / "cache").resolve()
    assert config.run_dir == run_config.parent.resolve()


def test_set_overrides_parse_values_as_yaml(run_config: Path):
    config = load_config(run_config, overrides=["train.batch_size=8", "hardware.compile=true",
                                                 "train.grad_clip_norm=null", "model.loss_weights.mel=2.5"])
    assert config.train.batch_size == 8 and config.hardware.compile is True
    assert config.train.grad_clip_norm is None and config.model.loss_weights.mel == 2.5


def test_environment_overrides_and_set_wins(run_config: Path):
    env = {"VOICESMITH_HARDWARE_PRECISION": "bf16-mixed", "VOICESMITH_HARDWARE_DETECT_ANOMALY": "true",
           "VOICESMITH_HARDWARE_COMPILE": "1", "UNRELATED": "x"}
    config = load_config(run_config, env=env)
    assert config.hardware.precision == "bf16-mixed"
    assert config.hardware.detect_anomaly is True and config.hardware.compile is True
    config = load_config(run_config, overrides=["hardware.precision=32"], env=env)
    assert config.hardware.precision == "32"


def test_presets_grow_and_tiny_stops_by_itself():
    sizes = [make_config("d", preset).model.hidden_channels for preset in ("tiny", "small", "medium", "high")]
    assert sizes == sorted(sizes) and len(set(sizes)) == 4
    assert make_config("d", "tiny").train.max_steps is not None


@pytest.mark.parametrize("override, words", [
    ("train.batch_sise=8", ["unknown key 'train.batch_sise'", "batch_size"]),
    ("train.batch_size=eight", ["'train.batch_size'", "'eight'", "integer"]),
    ("hardware.precision=fp8", ["'hardware.precision'", "'fp8'", "bf16-mixed"]),
    ("train.batch_size=0", ["'train.batch_size'", "greater than or equal to 1"]),
    ("nonsense.key=1", ["unknown key 'nonsense'"]),
])
def test_bad_values_name_the_key_the_value_and_what_is_allowed(run_config: Path, override, words):
    with pytest.raises(ConfigError) as error:
        load_config(run_config, overrides=[override])
    for word in words:
        assert word in str(error.value)
    assert str(run_config) in str(error.value)


def test_unknown_key_in_the_file_is_refused(run_config: Path):
    raw = yaml.safe_load(run_config.read_text())
    raw["train"]["learnig_rate"] = 1e-3
    run_config.write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError, match=r"unknown key 'train.learnig_rate'.*learning_rate"):
        load_config(run_config)


@pytest.mark.parametrize("content, words", [
    ("data: [unclosed", ["not valid YAML"]),
    ("- just\n- a list\n", ["must hold a mapping"]),
    ("model:\n  type: acoustic\n", ["'data' is required"]),
])
def test_malformed_files(tmp_path: Path, content, words):
    path = tmp_path / "config.yaml"
    path.write_text(content)
    with pytest.raises(ConfigError) as error:
        load_config(path)
    assert str(path) in str(error.value)
    for word in words:
        assert word in str(error.value)


def test_missing_config_file_and_missing_dataset(tmp_path: Path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")
    with pytest.raises(ConfigError, match="Dataset .*missing_corpus does not exist"):
        init_run(tmp_path / "missing_corpus", tmp_path / "run")


def test_malformed_override_syntax(run_config: Path):
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        load_config(run_config, overrides=["train.batch_size"])
    with pytest.raises(ConfigError, match="needs its section"):
        load_config(run_config, overrides=["batch_size=3"])
