"""Checkpoint io: atomic writes, clear refusals, never running code from a file."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from voicesmith.checkpoint import (CheckpointError, atomic_save, export_weights, load_checkpoint, load_exported,
                                   model_state)


def _checkpoint() -> dict:
    return {"state_dict": {"model.layer.weight": torch.arange(6.0).reshape(2, 3)},
            "voicesmith": {"format": 1, "model_type": "acoustic", "config": {"preset": "tiny"},
                           "symbols": {"_": [0]}, "speakers": {}}}


def test_round_trip_and_model_state(tmp_path: Path):
    atomic_save(_checkpoint(), tmp_path / "a.ckpt")
    ckpt = load_checkpoint(tmp_path / "a.ckpt")
    assert torch.equal(model_state(ckpt)["layer.weight"], torch.arange(6.0).reshape(2, 3))
    assert [p.name for p in tmp_path.iterdir()] == ["a.ckpt"]  # no temporary left behind


def test_truncated_empty_foreign_and_missing_files_are_refused_by_name(tmp_path: Path):
    atomic_save(_checkpoint(), tmp_path / "good.ckpt")
    data = (tmp_path / "good.ckpt").read_bytes()
    (tmp_path / "cut.ckpt").write_bytes(data[: len(data) // 2])
    (tmp_path / "empty.ckpt").write_bytes(b"")
    torch.save({"state_dict": {}}, tmp_path / "foreign.ckpt")
    for name, words in (("cut.ckpt", "truncated or corrupt"), ("empty.ckpt", "is empty"),
                        ("foreign.ckpt", "not a voicesmith checkpoint"), ("missing.ckpt", "does not exist")):
        with pytest.raises(CheckpointError, match=words) as error:
            load_checkpoint(tmp_path / name)
        assert name in str(error.value)


def test_a_pickle_with_a_code_payload_is_refused_without_running_it(tmp_path: Path):
    marker = tmp_path / "payload-ran"
    script = (f"import os, torch\n"
              f"class Payload:\n"
              f"    def __reduce__(self):\n"
              f"        return (os.system, ({f'touch {marker}'!r},))\n"
              f"torch.save({{'state_dict': {{}}, 'voicesmith': {{}}, 'x': Payload()}}, {str(tmp_path / 'evil.ckpt')!r})\n")
    subprocess.run([sys.executable, "-c", script], check=True, timeout=120)
    with pytest.raises(CheckpointError, match="asks to import"):
        load_checkpoint(tmp_path / "evil.ckpt")
    assert not marker.exists()


def test_orphaned_temporaries_of_dead_writers_are_removed(tmp_path: Path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True).stdout.strip()
    orphan = tmp_path / f".last.ckpt.tmp-{dead}"
    alive = tmp_path / f".last.ckpt.tmp-{os.getppid()}"
    orphan.write_bytes(b"half")
    alive.write_bytes(b"being written")
    atomic_save(_checkpoint(), tmp_path / "last.ckpt")
    assert not orphan.exists() and alive.exists()


def test_exported_weights_load_back_the_same(tmp_path: Path):
    ckpt = _checkpoint()
    export_weights(ckpt, tmp_path / "voice")
    assert sorted(p.name for p in (tmp_path / "voice").iterdir()) == ["model.safetensors", "voice.json"]
    again = load_exported(tmp_path / "voice")
    assert again["voicesmith"] == ckpt["voicesmith"]
    assert torch.equal(model_state(again)["layer.weight"], model_state(ckpt)["layer.weight"])
    (tmp_path / "voice" / "voice.json").unlink()
    with pytest.raises(CheckpointError, match="voice.json is missing"):
        load_exported(tmp_path / "voice")
