"""Synthesizer: a trained voice (checkpoint, run directory or exported weights) -> audio.

The same class speaks for `voicesmith synth`, for evaluation, and for the samples
written during training (`Synthesizer.from_model` wraps the live weights, no copy).
Long texts are split into sentences, each spoken on its own, and joined with short
pauses, so a paragraph never becomes one long unnatural breath.
"""

from __future__ import annotations

import logging
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional, Union

import numpy as np
import torch
from torch import nn

from voicesmith.audio import MEL_FLOOR, mel_spectrogram, write_wav
from voicesmith.checkpoint import BEST, CHECKPOINTS, EXPORT_CONFIG, LAST, load_checkpoint, load_exported, model_state
from voicesmith.config import VoiceConfig, validate_config
from voicesmith.errors import UserInputError
from voicesmith.models import build_model
from voicesmith.models.griffin_lim import griffin_lim
from voicesmith.onnx_voice import OnnxVoice, is_onnx_voice
from voicesmith.text import SymbolTable, TextFrontend
from voicesmith.vocoding import Vocoder, select_vocoder

logger = logging.getLogger(__name__)

PAUSE_SECONDS = 0.25  # between sentences of a long text
VOICE_TYPES = ("acoustic", "vits")  # model types that read text
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
    """Speaks with a VITS voice, or an acoustic model and its vocoder (Griffin-Lim unless the run has one).

    Build with `load(path)` or `from_model(...)`.
    """

    def __init__(self, model: nn.Module, config: VoiceConfig, symbols: SymbolTable, speakers: dict[str, int],
                 griffin_lim_iters: Optional[int] = None, vocoder: Optional[Vocoder] = None):
        if config.model.type not in VOICE_TYPES:
            raise UserInputError(f"A {config.model.type} model is not a voice: it cannot read text. Pass a "
                                 f"voice (an acoustic or VITS run); a vocoder goes with --vocoder.")
        self.model, self.config, self.symbols = model, config, symbols
        self.speaker_ids = {str(name): int(index) for name, index in speakers.items()}
        self.frontend = TextFrontend(config.text, symbols)
        self.griffin_lim_iters = griffin_lim_iters or config.samples.griffin_lim_iters
        self.vocoder = vocoder  # None: Griffin-Lim

    # --- construction ---------------------------------------------------------

    @classmethod
    def from_model(cls, model: nn.Module, config: VoiceConfig, symbols: SymbolTable, speakers: dict[str, int],
                   griffin_lim_iters: Optional[int] = None, vocoder: Optional[Vocoder] = None) -> "Synthesizer":
        """Wrap live weights (e.g. during training): nothing is copied or reloaded."""
        return cls(model, config, symbols, speakers, griffin_lim_iters, vocoder)

    @classmethod
    def load(cls, path: Union[str, Path], device: Union[str, torch.device] = "cpu",
             griffin_lim_iters: Optional[int] = None, vocoder: Optional[str] = None) -> Union["Synthesizer", OnnxVoice]:
        """From a checkpoint file, a run directory (checkpoints/best.ckpt, else last.ckpt) or an exported folder.

        `vocoder`: None speaks through the run's own vocoder (RUN_DIR/vocoder/) when it has one, else
        Griffin-Lim; "griffin-lim" or a vocoder checkpoint/run picks one (see voicesmith.vocoding).

        A `.onnx` path (any Piper voice, NAME.onnx.json beside it) gives an `OnnxVoice` instead: the same
        `synthesize` contract on onnxruntime.
        """
        if is_onnx_voice(path):
            return OnnxVoice.load(path)
        path = find_model_file(Path(path))
        ckpt = load_exported(path) if path.is_dir() else load_checkpoint(path)
        block = ckpt["voicesmith"]
        config = validate_config(block["config"], source=f"the config stored in {path}")
        config._path = run_dir_of(path) / "config.yaml"  # relative paths (a speaker encoder) resolve there
        if block.get("model_type", config.model.type) not in VOICE_TYPES:
            raise UserInputError(f"{path} holds a {block.get('model_type')!r} model, not a voice that reads text; "
                                 f"pass an acoustic or VITS run (a vocoder goes with --vocoder).")
        state, symbols = model_state(ckpt), SymbolTable.from_dict(block["symbols"])
        model = build_model(config.model, len(symbols), config.audio.n_mels,
                            speakers_in_weights(state), config.resolve, config.audio)
        try:
            model.load_state_dict(state)
        except RuntimeError as exc:
            raise UserInputError(f"The weights in {path} do not fit the model its own config describes "
                                 f"({str(exc).splitlines()[0]}). The file was changed or written by another "
                                 f"version; use another checkpoint.") from None
        return cls(model.to(device).eval(), config, symbols, block.get("speakers", {}), griffin_lim_iters,
                   select_vocoder(vocoder, config, str(path), device))

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

    def synthesize(self, text: str, speaker: Optional[str] = None, *, noise_scale: Optional[float] = None,
                   length_scale: Optional[float] = None, noise_w: Optional[float] = None) -> tuple[np.ndarray, int]:
        """float32 audio in [-1, 1] and its sample rate. `length_scale` > 1 speaks slower; None takes the
        voice's default (config `inference`). `noise_scale` / `noise_w` are VITS's sampling spreads (0:
        deterministic); the acoustic model is deterministic and refuses them."""
        result = self.synthesize_detailed(text, speaker, noise_scale=noise_scale, length_scale=length_scale,
                                          noise_w=noise_w)
        return result.audio, result.sample_rate

    def synthesize_detailed(self, text: str, speaker: Optional[str] = None, *, noise_scale: Optional[float] = None,
                            length_scale: Optional[float] = None, noise_w: Optional[float] = None) -> SynthesisResult:
        """Like `synthesize`, with the mel, alignment and durations that produced the audio."""
        sentences = self.frontend.split_sentences(text)
        if not sentences:
            raise UserInputError("No text to speak: the text is empty.")
        encoded = self.frontend.encode_batch(sentences)
        unknown = sorted({symbol for item in encoded for symbol in item.unknown})
        if unknown:
            logger.warning("Left out %d phoneme(s) this voice has no symbol for: %s", len(unknown), " ".join(unknown))
        return self._speak([item.ids for item in encoded], " ".join(item.phonemes for item in encoded),
                           self.speaker_id(speaker), self._scales(noise_scale, length_scale, noise_w))

    def synthesize_ids(self, phoneme_ids: list[int], speaker: Optional[str] = None, *,
                       noise_scale: Optional[float] = None, length_scale: Optional[float] = None,
                       noise_w: Optional[float] = None) -> SynthesisResult:
        """Speak one phoneme id sequence as it is (no sentence splitting), e.g. from a dataset item."""
        return self._speak([list(phoneme_ids)], "", self.speaker_id(speaker),
                           self._scales(noise_scale, length_scale, noise_w))

    def _scales(self, noise_scale: Optional[float], length_scale: Optional[float],
                noise_w: Optional[float]) -> dict[str, float]:
        """The model's keyword arguments for `infer`, defaults filled from the voice's config."""
        defaults = self.config.inference
        length_scale = defaults.length_scale if length_scale is None else length_scale
        if not length_scale > 0:
            raise UserInputError(f"length scale must be above 0 (1 is normal speed); got {length_scale}.")
        if self.config.model.type != "vits":
            if noise_scale is not None or noise_w is not None:
                raise UserInputError("noise scale and noise w set how VITS samples its voice; this acoustic voice is "
                                     "deterministic and has none. Leave out --noise-scale and --noise-w.")
            return {"length_scale": length_scale}
        scales = {"noise_scale": defaults.noise_scale if noise_scale is None else noise_scale,
                  "length_scale": length_scale, "noise_w": defaults.noise_w if noise_w is None else noise_w}
        for name in ("noise_scale", "noise_w"):
            if not scales[name] >= 0:
                raise UserInputError(f"{name.replace('_', ' ')} must be 0 or more (0: deterministic); got {scales[name]}.")
        return scales

    def _speak(self, sentences: list[list[int]], phonemes: str, speaker_id: int,
               scales: dict[str, float]) -> SynthesisResult:
        device = next(self.model.parameters()).device
        with evaluating(self.model), single_threaded_on_cpu(device):
            outputs = [self.model.infer(torch.tensor([ids], device=device), torch.tensor([len(ids)], device=device),
                                        torch.tensor([speaker_id], device=device), **scales) for ids in sentences]
            if self.config.model.type == "vits":
                pieces = [output["audio"][0, 0].float() for output in outputs]
                pause = pieces[0].new_zeros(self._pause_frames() * self.config.audio.hop_length)
                audio = _join_with_pauses(pieces, pause)
                mel = mel_spectrogram(audio, self.config.audio)
            else:
                pieces = [output["mel"][0].float() for output in outputs]
                mel = _join_with_pauses(pieces, pieces[0].new_full((pieces[0].shape[0], self._pause_frames()), MEL_FLOOR))
                if self.vocoder is not None:
                    audio = self.vocoder(mel)
                else:
                    audio = griffin_lim(mel, self.config.audio, n_iters=self.griffin_lim_iters)
        durations = [output["durations"][0].long().cpu().numpy() for output in outputs]
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


def _join_with_pauses(pieces: list[torch.Tensor], pause: torch.Tensor) -> torch.Tensor:
    """Sentences (mels `[n_mels, T]` or audio `[S]`) joined along time with `pause` between them."""
    joined = [pieces[0]]
    for piece in pieces[1:]:
        joined += [pause, piece]
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


def speakers_in_weights(state: dict[str, torch.Tensor]) -> int:
    """How many speakers the saved model was built for, read from its own weights."""
    for key in ("speaker_table.weight", "speaker_centroids", "emb_g.weight"):
        if key in state:
            return int(state[key].shape[0])
    return 1


def find_model_file(path: Path) -> Path:
    """A checkpoint file or an exported folder, from what the user named (file, run dir, export dir); an
    imported voice's run speaks from its imported weights until it has a checkpoint of its own."""
    from voicesmith.importers.voice_run import IMPORTED_CHECKPOINT

    if path.is_file():
        return path
    if path.is_dir():
        for folder in (path / CHECKPOINTS, path):
            for name in CHECKPOINT_NAMES:
                if (folder / name).is_file():
                    return folder / name
        if (path / EXPORT_CONFIG).is_file():
            return path
        if (path / IMPORTED_CHECKPOINT).is_file():
            return path / IMPORTED_CHECKPOINT
        raise UserInputError(f"{path} holds no voice: no checkpoints/best.ckpt or checkpoints/last.ckpt (train "
                             f"first) and no exported voice ({EXPORT_CONFIG} + model.safetensors).")
    raise UserInputError(f"Model {path} does not exist. Pass a checkpoint (.ckpt), a run directory or an "
                         f"exported voice folder.")


def run_dir_of(path: Path) -> Path:
    """The run directory a checkpoint belongs to: RUN_DIR/checkpoints/x.ckpt -> RUN_DIR."""
    path = path.resolve()
    if path.is_dir():
        return path
    return path.parent.parent if path.parent.name == CHECKPOINTS else path.parent


def synth_command(model_path: Path, text: str, out: Path, speaker: Optional[str] = None,
                  length_scale: Optional[float] = None,
                  noise_scale: Optional[float] = None, noise_w: Optional[float] = None,
                  vocoder: Optional[str] = None) -> int:
    """`voicesmith synth`: write a 16-bit WAV and print its path, duration and real-time factor."""
    synthesizer = Synthesizer.load(model_path, vocoder=vocoder)
    start = time.perf_counter()
    audio, sample_rate = synthesizer.synthesize(text, speaker, noise_scale=noise_scale, length_scale=length_scale,
                                                noise_w=noise_w)
    elapsed = time.perf_counter() - start
    write_wav(Path(out), audio, sample_rate)
    seconds = len(audio) / sample_rate
    print(f"{out}: {seconds:.2f} s of audio, synthesised in {elapsed:.2f} s "
          f"(real-time factor {elapsed / max(seconds, 1e-9):.3f})")
    return 0
