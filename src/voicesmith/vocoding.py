"""Trained vocoders at synthesis time: find, load, check against a voice's audio settings, run.

A two-stage run keeps its vocoder in RUN_DIR/vocoder/ (its own checkpoints, logs and summary);
`Synthesizer.load` speaks through it by default. `--vocoder griffin-lim|PATH` picks Griffin-Lim or
another vocoder: a vocoder checkpoint or run can serve any voice with the same audio settings, and
any difference in them is refused, naming each setting.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Optional, Union

import torch
from torch import nn

from voicesmith.checkpoint import BEST, CHECKPOINTS, LAST, load_checkpoint, model_state
from voicesmith.config import AudioConfig, validate_config
from voicesmith.errors import UserInputError

if TYPE_CHECKING:
    from voicesmith.config import VoiceConfig

VOCODER_FOLDER = "vocoder"  # RUN_DIR/vocoder/: the second stage of a two-stage run
GRIFFIN_LIM = "griffin-lim"
GENERATOR_PREFIX = "generator."
# What must agree between a vocoder and the mels it is given.
MATCHED_AUDIO_SETTINGS = ("sample_rate", "hop_length", "n_fft", "win_length", "n_mels", "f_min", "f_max")


class Vocoder:
    """A trained generator and the audio settings of its mels: `vocoder(mel [n_mels, T]) -> audio [T * hop]`."""

    def __init__(self, generator: nn.Module, audio: AudioConfig, source: str):
        self.generator, self.audio, self.source = generator, audio, source

    @classmethod
    def load(cls, path: Union[str, Path], device: Union[str, torch.device] = "cpu") -> "Vocoder":
        """From a vocoder checkpoint or a vocoder run directory (checkpoints/best.ckpt, else last.ckpt)."""
        from voicesmith.models.vocoder import build_generator

        path, ckpt, config = read_vocoder_checkpoint(Path(path))
        generator = build_generator(config.model, config.audio)
        state = {key[len(GENERATOR_PREFIX):]: value for key, value in model_state(ckpt).items()
                 if key.startswith(GENERATOR_PREFIX)}
        try:
            generator.load_state_dict(state)
        except RuntimeError as exc:
            raise UserInputError(f"The generator weights in {path} do not fit the vocoder its config describes "
                                 f"({str(exc).splitlines()[0]}); use another checkpoint.") from None
        generator.remove_weight_norm()  # folded once: faster, and the same audio
        return cls(generator.to(device).eval(), config.audio, str(path))

    def check_audio(self, audio: AudioConfig, voice: str) -> None:
        check_audio_settings(self.audio, audio, self.source, voice)

    def __call__(self, mel: torch.Tensor) -> torch.Tensor:
        """Log-mel `[n_mels, T]` -> audio `[T * hop]` (no gradient)."""
        with torch.no_grad():
            return self.generator(mel.unsqueeze(0).to(self.device)).reshape(-1)

    @property
    def device(self) -> torch.device:
        return next(self.generator.parameters()).device


def check_audio_settings(vocoder_audio: AudioConfig, voice_audio: AudioConfig, vocoder: str, voice: str) -> None:
    """Refuse a voice whose mels differ from a vocoder's in any setting that shapes them, naming each one."""
    differences = [f"{name} {getattr(voice_audio, name)} (vocoder: {getattr(vocoder_audio, name)})"
                   for name in MATCHED_AUDIO_SETTINGS if getattr(voice_audio, name) != getattr(vocoder_audio, name)]
    if differences:
        raise UserInputError(f"The vocoder {vocoder} was trained on other audio settings than the voice {voice}: "
                             f"{', '.join(differences)}. Use a vocoder trained with the voice's audio settings "
                             f"(`voicesmith train CONFIG --stage vocoder` trains one for a run), or "
                             f"--vocoder {GRIFFIN_LIM}.")


def read_vocoder_checkpoint(path: Path) -> tuple[Path, dict, "VoiceConfig"]:
    """(checkpoint file, its content, its config) of a vocoder checkpoint or run; anything else is refused."""
    path = checkpoint_of(path)
    ckpt = load_checkpoint(path)
    block = ckpt["voicesmith"]
    if block.get("model_type") != "vocoder":
        raise UserInputError(f"{path} holds a model of type {block.get('model_type')!r}, not a vocoder. Pass a "
                             f"vocoder checkpoint or run (trained with `voicesmith init DATA RUN --model vocoder` or "
                             f"`train --stage both`), or --vocoder {GRIFFIN_LIM}.")
    return path, ckpt, validate_config(block["config"], source=f"the config stored in {path}")


def checkpoint_of(path: Path) -> Path:
    """A checkpoint file as given, or the best (else last) checkpoint of a run directory."""
    if path.is_file():
        return path
    for name in (BEST, LAST):
        if (path / CHECKPOINTS / name).is_file():
            return path / CHECKPOINTS / name
    raise UserInputError(f"Vocoder {path} does not exist or holds no checkpoints/best.ckpt or last.ckpt; pass a "
                         f"vocoder checkpoint, a vocoder run directory, or --vocoder {GRIFFIN_LIM}.")


def run_vocoder_dir(run_dir: Path) -> Path:
    return Path(run_dir) / VOCODER_FOLDER


def has_run_vocoder(run_dir: Path) -> bool:
    """Whether a run has a trained second-stage vocoder."""
    return any((run_vocoder_dir(run_dir) / CHECKPOINTS / name).is_file() for name in (BEST, LAST))


def select_vocoder(choice: Optional[str], config: "VoiceConfig", voice: str,
                   device: Union[str, torch.device] = "cpu") -> Optional[Vocoder]:
    """The vocoder a voice speaks through: None (Griffin-Lim) or a checked `Vocoder`.

    `choice` None: the run's own vocoder when it has one; "griffin-lim": Griffin-Lim; else a path.
    """
    if choice == GRIFFIN_LIM:
        return None
    if choice is None:
        if not has_run_vocoder(config.run_dir):
            return None
        choice = str(run_vocoder_dir(config.run_dir))
    vocoder = Vocoder.load(choice, device)
    vocoder.check_audio(config.audio, voice)
    return vocoder
