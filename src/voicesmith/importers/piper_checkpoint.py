"""Piper's Lightning training checkpoint (`.ckpt`) with the voice config Piper's training writes.

The generator `model_g.*` and the discriminator `model_d.*` map by name onto voicesmith's VITS
(`discriminator.*`), old-style weight norm included. The architecture comes from the tensor shapes,
the decoder's strides and dilations and the audio settings from `hyper_parameters`, the ids and
scales from the voice config. Piper's optimizer state, epoch and step are not taken: a fine-tune
is a new run starting at step 0.

Loading never unpickles code: `torch.load(weights_only=True)`, with only pathlib's path types
allowed beyond plain data (older Piper checkpoints hold the dataset paths as `PosixPath`).
"""

from __future__ import annotations

import pathlib
from pathlib import Path
from typing import Any, Mapping

from voicesmith.checkpoint import CheckpointError, load_checkpoint
from voicesmith.errors import UserInputError
from voicesmith.importers.mapping import rename
from voicesmith.importers.piper_voice import (architecture, read_voice_config, resblock_type,
                                              voice_sections)
from voicesmith.importers.voice_run import VoiceSource

HARMLESS_TYPES = (pathlib.PosixPath, pathlib.PurePosixPath, pathlib.PureWindowsPath)
PIPER_PERIODS = (2, 3, 5, 7, 11)
CONFIG_SEARCH_DEPTH = 4  # Piper writes config.json in the training folder, the .ckpt in lightning_logs/version_N/checkpoints/
# hyper_parameters name -> (section, key) in voicesmith's config
HYPER_PARAMETERS = {"resblock": ("model", "resblock"), "resblock_kernel_sizes": ("model", "resblock_kernel_sizes"),
                    "resblock_dilation_sizes": ("model", "resblock_dilation_sizes"),
                    "upsample_rates": ("model", "upsample_rates"), "filter_length": ("audio", "n_fft"),
                    "hop_length": ("audio", "hop_length"), "win_length": ("audio", "win_length"),
                    "mel_channels": ("audio", "n_mels"), "mel_fmin": ("audio", "f_min"),
                    "mel_fmax": ("audio", "f_max"), "c_mel": ("model.loss_weights", "mel"),
                    "c_kl": ("model.loss_weights", "kl")}


def read_piper_checkpoint(path: Path) -> VoiceSource:
    path = Path(path)
    voice, preset = read_voice_config(find_voice_config(path))
    ckpt = load_piper_checkpoint(path)
    state = ckpt["state_dict"]
    tensors = rename({name: value for name, value in state.items() if name.startswith(("model_g.", "model_d."))},
                     [(r"^model_g\.", ""), (r"^model_d\.", "discriminator.")])
    hyper = ckpt.get("hyper_parameters") or {}
    sections = _sections(hyper, tensors)
    model = architecture(tensors, sections.pop("decoder"))
    model.update(sections.pop("model"))
    notes = [f"Not taken from the checkpoint: Piper's optimizer state, epoch {ckpt.get('epoch', '?')} and step "
             f"{ckpt.get('global_step', '?')} (a fine-tune starts at step 0 with fresh optimizers)."]
    others = sorted(name for name in state if not name.startswith(("model_g.", "model_d.")))
    if others:
        notes.append(f"{len(others)} state_dict entries outside model_g/model_d are not used: {', '.join(others[:5])}")
    fresh = {} if any(name.startswith("discriminator.") for name in tensors) else \
        {"discriminator.": "the checkpoint holds no discriminator (model_d); it starts fresh"}
    return VoiceSource(kind="Piper checkpoint", path=path, tensors=tensors, preset=preset,
                       sections=voice_sections(voice, model, sections.pop("audio")) | sections,
                       symbols=voice.symbols, n_speakers=voice.num_speakers, speakers=voice.speaker_id_map,
                       fresh=fresh, notes=notes)


def find_voice_config(path: Path) -> Path:
    """config.json (Piper's training folder) or NAME.onnx.json beside the checkpoint or in a folder above it."""
    for folder in list(path.parents)[:CONFIG_SEARCH_DEPTH]:
        for candidate in (folder / "config.json", folder / f"{path.stem}.onnx.json"):
            if candidate.is_file():
                return candidate
    raise UserInputError(f"No voice config found for {path}: put the config.json that Piper's preprocessing wrote "
                         f"(or the voice's NAME.onnx.json) beside the checkpoint; it holds the phoneme ids and "
                         f"the sample rate, which the checkpoint lacks.")


def load_piper_checkpoint(path: Path) -> dict[str, Any]:
    """The checkpoint as plain data; anything beyond tensors, plain data and pathlib paths is refused unread."""
    import torch

    try:
        with torch.serialization.safe_globals(list(HARMLESS_TYPES)):
            return load_checkpoint(path, require_voicesmith=False)
    except CheckpointError as exc:
        raise CheckpointError(f"{exc} (import-voice allows tensors, plain data and pathlib paths, which is all a "
                              f"Piper checkpoint holds; nothing of this file was run.)") from None


def _sections(hyper: Mapping[str, Any], tensors: Mapping) -> dict[str, dict[str, Any]]:
    """Config values the hyper-parameters give: decoder strides, audio, loss weights, segment, periods."""
    sections: dict[str, dict[str, Any]] = {"decoder": {"resblock": resblock_type(tensors)}, "model": {}, "audio": {}}
    for key, (section, name) in HYPER_PARAMETERS.items():
        if hyper.get(key) is None:
            continue
        value = str(hyper[key]) if key == "resblock" else hyper[key]
        if section == "model.loss_weights":
            sections["model"].setdefault("loss_weights", {})[name] = float(value)
        else:
            sections["decoder" if section == "model" else section][name] = value
    hop = sections["audio"].get("hop_length", 256)
    if hyper.get("segment_size"):
        sections["model"]["segment_frames"] = int(hyper["segment_size"]) // int(hop)
    n_discriminators = len({name.split(".")[2] for name in tensors if name.startswith("discriminator.discriminators.")})
    if n_discriminators > 1:
        sections["model"]["discriminator_periods"] = list(PIPER_PERIODS[:n_discriminators - 1])
    return sections
