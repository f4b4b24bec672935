"""Synthesizer: a trained voice (checkpoint, run directory or exported weights) -> audio.

The same class speaks for `voicesmith synth`, for evaluation, and for the samples
written during training (`Synthesizer.from_model` wraps the live weights, no copy).
Long texts are split into sentences, each spoken on its own, and joined with short
pauses, so a paragraph never becomes one long unnatural breath.
"""

from __future__ import annotations

import logging
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional, Union

import numpy as np
import torch
from torch import nn

from voicesmith.audio import MEL_FLOOR, write_wav
from voicesmith.checkpoint import BEST, CHECKPOINTS, EXPORT_CONFIG, LAST, load_checkpoint, load_exported, model_state
from voicesmith.config import VoiceConfig, validate_config
from voicesmith.errors import NotBuiltYet, UserInputError
from voicesmith.models import build_model
from voicesmith.models.griffin_lim import griffin_lim
from voicesmith.text import SymbolTable, TextFrontend

logger = logging.getLogger(__name__)

PAUSE_SECONDS = 0.25  # between sentences of a long text
CHECKPOINT_NAMES = (BEST, LAST)


@dataclass
class SynthesisResult:
    """Audio plus what produced it, for pictures and evaluation (sentences joined, pauses included)."""

    audio: np.ndarray  # float32 [samples] = mel frames * hop_length
    sample_rate: int
    mel: np.ndarray  # [n_mels, T] log-mel the vocoder spoke
    alignment: np.ndarray  # [T_text, T] phoneme -> frames (0/1); pause frames belong to no phoneme
    durations: np.ndarray  # [T_text] frames per phoneme id
    phoneme_ids: list[int]
    phonemes: str

    @property
    def seconds(self) -> float:
        return len(self.audio) / self.sample_rate


class Synthesizer:
    """Speaks with an acoustic model and Griffin-Lim. Build with `load(path)` or `from_model(...)`."""

    def __init__(self, model: nn.Module, config: VoiceConfig, symbols: SymbolTable, speakers: dict[str, int],
                 griffin_lim_iters: Optional[int] = None):
        if config.model.type != "acoustic":
            raise NotBuiltYet(f"Synthesis for model.type={config.model.type!r} is not built yet; "
                              f"acoustic voices speak today.")
        self.model, self.config, self.symbols = model, config, symbols
        self.speaker_ids = {str(name): int(index) for name, index in speakers.items()}
        self.frontend = TextFrontend(config.text, symbols)
        self.griffin_lim_iters = griffin_lim_iters or config.samples.griffin_lim_iters

    # --- construction ---------------------------------------------------------

    @classmethod
    def from_model(cls, model: nn.Module, config: VoiceConfig, symbols: SymbolTable, speakers: dict[str, int],
                   griffin_lim_iters: Optional[int] = None) -> "Synthesizer":
        """Wrap live weights (e.g. during training): nothing is copied or reloaded."""
        return cls(model, config, symbols, speakers, griffin_lim_iters)

    @classmethod
    def load(cls, path: Union[str, Path], device: Union[str, torch.device] = "cpu",
             griffin_lim_iters: Optional[int] = None) -> "Synthesizer":
        """From a checkpoint file, a run directory (checkpoints/best.ckpt, else last.ckpt) or an exported folder."""
        path = find_model_file(Path(path))
        ckpt = load_exported(path) if path.is_dir() else load_checkpoint(path)
        block = ckpt["voicesmith"]
        config = validate_config(block["config"], source=f"the config stored in {path}")
        config._path = _run_dir_of(path) / "config.yaml"  # relative paths (a speaker encoder) resolve there
        if block.get("model_type", config.model.type) != "acoustic":
            raise NotBuiltYet(f"{path} holds a {block.get('model_type')!r} voice; synthesis for it is not built "
                              f"yet, acoustic voices speak today.")
        state, symbols = model_state(ckpt), SymbolTable.from_dict(block["symbols"])
        model = build_model(config.model, len(symbols), config.audio.n_mels,
                            _n_speakers(state), config.resolve)
        try:
            model.load_state_dict(state)
        except RuntimeError as exc:
            raise UserInputError(f"The weights in {path} do not fit the model its own config describes "
                                 f"({str(exc).splitlines()[0]}). The file was changed or written by another "
                                 f"version; use another checkpoint.") from None
        return cls(model.to(device).eval(), config, symbols, block.get("speakers", {}), griffin_lim_iters)

    # --- properties -----------------------------------------------------------

    @property
    def speakers(self) -> list[str]:
        """Speaker names in id order (empty for a single-speaker voice)."""
        return [name for name, _ in sorted(self.speaker_ids.items(), key=lambda item: item[1]) if name]

    @property
    def sample_rate(self) -> int:
        return self.config.audio.sample_rate

    def speaker_id(self, speaker: Optional[str]) -> int:
        """The id of a speaker name; None is the first speaker."""
        if speaker is None:
            return min(self.speaker_ids.values(), default=0)
        if speaker not in self.speaker_ids:
            known = ", ".join(self.speakers)
            advice = (f"This voice knows: {known}. Pass one of them with --speaker." if known
                      else "This is a single-speaker voice; leave out --speaker.")
            raise UserInputError(f"Unknown speaker {speaker!r}. {advice}")
        return self.speaker_ids[speaker]

    # --- synthesis ------------------------------------------------------------

    def synthesize(self, text: str, speaker: Optional[str] = None, length_scale: float = 1.0,
                   noise_scale: Optional[float] = None, noise_w: Optional[float] = None) -> tuple[np.ndarray, int]:
        """float32 audio in [-1, 1] and its sample rate. `length_scale` > 1 speaks slower.

        `noise_scale` / `noise_w` exist for command-line compatibility with VITS voices; the acoustic
        model is deterministic and ignores them.
        """
        result = self.synthesize_detailed(text, speaker, length_scale)
        return result.audio, result.sample_rate

    def synthesize_detailed(self, text: str, speaker: Optional[str] = None,
                            length_scale: float = 1.0) -> SynthesisResult:
        """Like `synthesize`, with the mel, alignment and durations that produced the audio."""
        sentences = self.frontend.split_sentences(text)
        if not sentences:
            raise UserInputError("No text to speak: the text is empty.")
        encoded = self.frontend.encode_batch(sentences)
        unknown = sorted({symbol for item in encoded for symbol in item.unknown})
        if unknown:
            logger.warning("Left out %d phoneme(s) this voice has no symbol for: %s", len(unknown), " ".join(unknown))
        return self._speak([item.ids for item in encoded], " ".join(item.phonemes for item in encoded),
                           self.speaker_id(speaker), length_scale)

    def synthesize_ids(self, phoneme_ids: list[int], speaker: Optional[str] = None,
                       length_scale: float = 1.0) -> SynthesisResult:
        """Speak one phoneme id sequence as it is (no sentence splitting), e.g. from a dataset item."""
        return self._speak([list(phoneme_ids)], "", self.speaker_id(speaker), length_scale)

    def _speak(self, sentences: list[list[int]], phonemes: str, speaker_id: int,
               length_scale: float) -> SynthesisResult:
        if not length_scale > 0:
            raise UserInputError(f"length scale must be above 0 (1 is normal speed); got {length_scale}.")
        device = next(self.model.parameters()).device
        with evaluating(self.model), single_threaded_on_cpu(device):
            pieces = []
            for ids in sentences:
                output = self.model.infer(torch.tensor([ids], device=device), torch.tensor([len(ids)], device=device),
                                          torch.tensor([speaker_id], device=device), length_scale=length_scale)
                pieces.append((output["mel"][0].float(), output["durations"][0]))
            mel = _join_with_pauses([mel for mel, _ in pieces], self._pause_frames())
            audio = griffin_lim(mel, self.config.audio, n_iters=self.griffin_lim_iters)
        durations = [durations.cpu().numpy() for _, durations in pieces]
        return SynthesisResult(
            audio=audio.cpu().numpy().astype(np.float32), sample_rate=self.sample_rate, mel=mel.cpu().numpy(),
            alignment=_block_alignment(durations, self._pause_frames(), mel.shape[-1]),
            durations=np.concatenate(durations), phoneme_ids=[i for ids in sentences for i in ids], phonemes=phonemes)

    def _pause_frames(self) -> int:
        return round(PAUSE_SECONDS * self.sample_rate / self.config.audio.hop_length)


@contextmanager
def evaluating(model: nn.Module) -> Iterator[None]:
    """eval() and no_grad for the duration, then the model's previous train/eval mode again."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        model.train(was_training)


@contextmanager
def single_threaded_on_cpu(device: torch.device) -> Iterator[None]:
    """One intra-op thread while synthesising on the CPU, then the previous count again.

    Griffin-Lim and a small acoustic model run thousands of small operations. With several
    threads each operation waits for all of them, and on a busy machine one of them is often
    descheduled: measured on 2 cores with other work running, 2 threads took 35x longer than 1;
    on an idle machine both are equally fast.
    """
    previous = torch.get_num_threads()
    if device.type == "cpu":
        torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def _join_with_pauses(mels: list[torch.Tensor], pause_frames: int) -> torch.Tensor:
    pause = mels[0].new_full((mels[0].shape[0], pause_frames), MEL_FLOOR)
    joined = [mels[0]]
    for mel in mels[1:]:
        joined += [pause, mel]
    return torch.cat(joined, dim=-1)


def _block_alignment(durations: list[np.ndarray], pause_frames: int, n_frames: int) -> np.ndarray:
    """The sentences' alignments side by side, with pause frames in between that no phoneme owns."""
    alignment = np.zeros((sum(len(d) for d in durations), n_frames), dtype=np.float32)
    row = frame = 0
    for sentence in durations:
        for length in sentence.tolist():
            alignment[row, frame:frame + length] = 1.0
            row, frame = row + 1, frame + length
        frame += pause_frames
    return alignment


def _n_speakers(state: dict[str, torch.Tensor]) -> int:
    """How many speakers the saved model was built for, read from its own weights."""
    for key in ("speaker_table.weight", "speaker_centroids"):
        if key in state:
            return int(state[key].shape[0])
    return 1


def find_model_file(path: Path) -> Path:
    """A checkpoint file or an exported folder, from what the user named (file, run dir, export dir)."""
    if path.suffix.lower() == ".onnx":
        raise NotBuiltYet(f"{path}: speaking with ONNX voices is not built yet; pass the checkpoint or run "
                          f"directory it was exported from.")
    if path.is_file():
        return path
    if path.is_dir():
        for folder in (path / CHECKPOINTS, path):
            for name in CHECKPOINT_NAMES:
                if (folder / name).is_file():
                    return folder / name
        if (path / EXPORT_CONFIG).is_file():
            return path
        raise UserInputError(f"{path} holds no voice: no checkpoints/best.ckpt or checkpoints/last.ckpt (train "
                             f"first) and no exported voice ({EXPORT_CONFIG} + model.safetensors).")
    raise UserInputError(f"Model {path} does not exist. Pass a checkpoint (.ckpt), a run directory or an "
                         f"exported voice folder.")


def _run_dir_of(path: Path) -> Path:
    """The run directory a checkpoint belongs to: RUN_DIR/checkpoints/x.ckpt -> RUN_DIR."""
    path = path.resolve()
    if path.is_dir():
        return path
    return path.parent.parent if path.parent.name == CHECKPOINTS else path.parent


def synth_command(model_path: Path, text: str, out: Path, speaker: Optional[str] = None, length_scale: float = 1.0,
                  noise_scale: Optional[float] = None, noise_w: Optional[float] = None) -> int:
    """`voicesmith synth`: write a 16-bit WAV and print its path, duration and real-time factor."""
    synthesizer = Synthesizer.load(model_path)
    if noise_scale is not None or noise_w is not None:
        print("note: --noise-scale and --noise-w apply to VITS voices; this acoustic voice ignores them.",
              file=sys.stderr)
    start = time.perf_counter()
    audio, sample_rate = synthesizer.synthesize(text, speaker, length_scale)
    elapsed = time.perf_counter() - start
    write_wav(Path(out), audio, sample_rate)
    seconds = len(audio) / sample_rate
    print(f"{out}: {seconds:.2f} s of audio, synthesised in {elapsed:.2f} s "
          f"(real-time factor {elapsed / max(seconds, 1e-9):.3f})")
    return 0
