"""Checkpoint files: written atomically, read without ever running code from them.

A checkpoint is a Lightning checkpoint dict plus a `voicesmith` block that
holds everything needed to rebuild the voice without the training code:
the config, the symbol table and the speaker map. `torch.load` runs with
`weights_only=True`, so a pickle carrying code is refused, not executed.
"""

from __future__ import annotations

import json
import pickle
import re
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from voicesmith.errors import UserInputError
from voicesmith.fileio import atomic_write, atomic_write_json, temporary_writer

if TYPE_CHECKING:
    from voicesmith.config import VoiceConfig
    from voicesmith.text import SymbolTable

FORMAT_VERSION = 1
CHECKPOINTS, LAST, BEST = "checkpoints", "last.ckpt", "best.ckpt"  # RUN_DIR/checkpoints/{last,best}.ckpt
MODEL_PREFIX = "model."
EXPORT_WEIGHTS = "model.safetensors"
EXPORT_CONFIG = "voice.json"


class CheckpointError(UserInputError):
    """A checkpoint that is missing, truncated, corrupt, foreign or unsafe."""


def atomic_save(obj: Any, path: Path) -> None:
    """torch.save to a temporary file, fsync, then rename: a crash never leaves a half-written file.
    A full disk raises DiskFull naming what to delete; the previous file stays as it was."""
    path = Path(path)
    _remove_orphaned_temporaries(path)
    to_free = (f"older checkpoints in {path.parent} (step-<N>.ckpt; lower train.keep_last_k), previous-* folders "
               f"of runs restarted with --resume never, or other runs you no longer need")
    atomic_write(path, lambda handle: torch.save(obj, handle), to_free=to_free)


def _remove_orphaned_temporaries(path: Path) -> None:
    """A process killed mid-save (kill -9) leaves its temporary file; remove those whose writer is gone."""
    import psutil

    for tmp in path.parent.glob(f".{path.name}.tmp-*"):
        pid = temporary_writer(tmp)
        if pid is not None and not psutil.pid_exists(pid):
            tmp.unlink(missing_ok=True)


def load_checkpoint(path: Path, require_voicesmith: bool = True) -> dict[str, Any]:
    """Read a checkpoint safely; every failure is a CheckpointError that names the file and why."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"Checkpoint {path} does not exist.")
    if path.stat().st_size == 0:
        raise CheckpointError(f"Checkpoint {path} is empty (0 bytes); it was probably cut off while being written.")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        raise CheckpointError(
            f"Checkpoint {path} was refused: it contains objects other than tensors and plain data "
            f"({_unsafe_global(exc)}). voicesmith never unpickles code from a file; only load checkpoints "
            f"that voicesmith wrote.") from None
    except (RuntimeError, EOFError, zipfile.BadZipFile, OSError, ValueError) as exc:
        raise CheckpointError(
            f"Checkpoint {path} is truncated or corrupt and cannot be read ({_first_line(exc)}). "
            f"Use an earlier checkpoint (checkpoints/step-<N>.ckpt) or start again.") from None
    if not isinstance(ckpt, dict) or "state_dict" not in ckpt:
        raise CheckpointError(f"{path} is not a training checkpoint (no state_dict).")
    if require_voicesmith and "voicesmith" not in ckpt:
        raise CheckpointError(
            f"{path} is not a voicesmith checkpoint (no voicesmith block with config and symbols). "
            f"To start from a published voice, use `voicesmith import-voice`.")
    version = ckpt.get("voicesmith", {}).get("format", FORMAT_VERSION)
    if version > FORMAT_VERSION:
        raise CheckpointError(f"Checkpoint {path} has format {version}; this voicesmith reads up to "
                              f"{FORMAT_VERSION}. Upgrade voicesmith.")
    return ckpt


def voicesmith_block(config: "VoiceConfig", symbols: "SymbolTable", speakers: dict[str, int],
                     global_step: int) -> dict[str, Any]:
    """What a checkpoint needs to become a voice without the training code (see the module docstring)."""
    return {"format": FORMAT_VERSION, "model_type": config.model.type, "config": config.to_dict(),
            "symbols": symbols.to_dict(), "speakers": dict(speakers), "global_step": int(global_step)}


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:200] if text else type(exc).__name__


def _unsafe_global(exc: BaseException) -> str:
    """Name what the pickle wanted to import; torch's own advice (weights_only=False) is the unsafe one."""
    match = re.search(r"(?:unsupported|Unsupported global:) GLOBAL (\S+)", str(exc))
    return f"it asks to import {match.group(1)}" if match else "it is not a plain-data pickle"


def model_state(ckpt: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The model's own weights: the LightningModule's `model.` prefix stripped."""
    return {key[len(MODEL_PREFIX):]: value for key, value in ckpt["state_dict"].items()
            if key.startswith(MODEL_PREFIX)}


def export_weights(ckpt: dict[str, Any], out_dir: Path) -> Path:
    """The sharing form: safetensors weights + a JSON of config, symbols and speakers (no pickle at all)."""
    from safetensors.torch import save_file

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    weights = {name: tensor.contiguous() for name, tensor in model_state(ckpt).items()}
    save_file(weights, str(out_dir / EXPORT_WEIGHTS))
    meta = dict(ckpt["voicesmith"])
    atomic_write_json(out_dir / EXPORT_CONFIG, meta, indent=2)
    return out_dir


def load_exported(folder: Path) -> dict[str, Any]:
    """An exported folder read back in checkpoint shape, so one loader serves both."""
    from safetensors.torch import load_file

    folder = Path(folder)
    weights_path, config_path = folder / EXPORT_WEIGHTS, folder / EXPORT_CONFIG
    for required in (weights_path, config_path):
        if not required.is_file():
            raise CheckpointError(f"{folder} is not an exported voice: {required.name} is missing.")
    try:
        meta = json.loads(config_path.read_text(encoding="utf-8"))
        weights = load_file(str(weights_path))
    except (ValueError, OSError) as exc:
        raise CheckpointError(f"Exported voice {folder} is corrupt: {_first_line(exc)}") from None
    return {"voicesmith": meta, "state_dict": {MODEL_PREFIX + k: v for k, v in weights.items()}}
