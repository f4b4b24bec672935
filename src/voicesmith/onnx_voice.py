"""Any Piper voice (`NAME.onnx` + `NAME.onnx.json`) spoken with onnxruntime, without torch.

Text is read by voicesmith's own front end (normalisation, espeak-ng, Piper-style ids) with the
voice's espeak voice, phoneme type and phoneme_id_map, then each sentence is one call of the graph,
as the Piper runtime does it. `stream` yields sentence after sentence, so a long text starts
playing after its first sentence; `synthesize` joins them back to back, as Piper does.

The audio is the model's own: no peak normalisation (the Piper runtime normalises each sentence by
default, which hides the voice's loudness). The graph is checked against its config when loaded: a
`sid` input exactly when the config has several speakers, and symbol and speaker tables of the
sizes the config names.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Iterator, Optional, Union

import numpy as np

from voicesmith.config import VoiceConfig, validate_config
from voicesmith.errors import ConfigError, UserInputError
from voicesmith.fileio import temporary_path
from voicesmith.piper_config import PiperConfig, config_path_for, read_piper_config
from voicesmith.text import SymbolTable, TextFrontend

logger = logging.getLogger(__name__)

ONNX_SUFFIX = ".onnx"
GRAPH_INPUTS = ("input", "input_lengths", "scales")


def is_onnx_voice(path: Union[str, Path]) -> bool:
    return Path(path).suffix.lower() == ONNX_SUFFIX


@dataclass
class SpokenSentence:
    """One sentence of a text and its audio (float32 [samples], the model's own level)."""

    text: str
    phonemes: str
    phoneme_ids: list[int]
    audio: np.ndarray


class OnnxVoice:
    """A Piper voice on onnxruntime, with the Synthesizer's `synthesize` contract (DESIGN.md)."""

    def __init__(self, session, piper: PiperConfig, model_path: Path) -> None:
        self.session, self.piper, self.model_path = session, piper, model_path
        self.symbols: SymbolTable = piper.symbols
        try:
            self.frontend = TextFrontend(piper.text_config, self.symbols)
        except ConfigError as error:
            raise UserInputError(f"{piper.path}: espeak.voice {piper.espeak_voice!r} cannot be read by "
                                 f"voicesmith's front end: {error}") from None
        if piper.vowel_clusters:
            logger.warning("%s merges vowel clusters (vowel_clusters); voicesmith's front end does not, so this "
                           "voice hears those vowels one by one and may sound less natural than in the Piper "
                           "runtime.", piper.path)

    @classmethod
    def load(cls, path: Union[str, Path], threads: Optional[int] = None) -> "OnnxVoice":
        """`path` is NAME.onnx; its config NAME.onnx.json must be beside it. `threads` None: onnxruntime's choice."""
        path = Path(path)
        if not path.is_file():
            raise UserInputError(f"ONNX voice {path} does not exist. Pass a Piper voice: NAME.onnx with "
                                 f"NAME.onnx.json beside it.")
        piper = read_piper_config(config_path_for(path))
        session = _open_session(path, threads)
        check_graph(path, piper, session)
        return cls(session, piper, path)

    # --- what the voice is ----------------------------------------------------

    @property
    def sample_rate(self) -> int:
        return self.piper.sample_rate

    @property
    def multi_speaker(self) -> bool:
        return self.piper.num_speakers > 1

    @property
    def speakers(self) -> list[str]:
        """Speaker names in id order; ids as text when the voice names none; empty for one speaker."""
        if not self.multi_speaker:
            return []
        if self.piper.speaker_id_map:
            return [name for name, _ in sorted(self.piper.speaker_id_map.items(), key=lambda item: item[1])]
        return [str(index) for index in range(self.piper.num_speakers)]

    @cached_property
    def config(self) -> VoiceConfig:
        """The voice's settings as a run config (evaluation reads rates, language and trimming from it)."""
        stored = self.piper.voicesmith.get("config")
        if stored:
            return validate_config(stored, source=f"the voicesmith block of {self.piper.path}")
        piper = self.piper
        return VoiceConfig(data={"dataset": ""}, model={"type": "vits"}, text=piper.text_config.model_dump(),
                           audio={"sample_rate": piper.sample_rate, "hop_length": piper.hop_length},
                           inference={"noise_scale": piper.noise_scale, "length_scale": piper.length_scale,
                                      "noise_w": piper.noise_w})

    def speaker_id(self, speaker: Optional[str]) -> Optional[int]:
        """The graph's `sid` for a speaker name (None: the voice's default); None for a single-speaker voice."""
        if not self.multi_speaker:
            if speaker is not None:
                raise UserInputError(f"{self.model_path} is a single-speaker voice; leave out --speaker.")
            return None
        if speaker is None:
            return self.piper.default_speaker_id
        if speaker in self.piper.speaker_id_map:
            return self.piper.speaker_id_map[speaker]
        if not self.piper.speaker_id_map and speaker.isdigit() and int(speaker) < self.piper.num_speakers:
            return int(speaker)
        raise UserInputError(f"Unknown speaker {speaker!r}. {self.model_path} knows: {', '.join(self.speakers)}. "
                             f"Pass one of them with --speaker.")

    # --- speaking -------------------------------------------------------------

    def synthesize(self, text: str, speaker: Optional[str] = None, *, noise_scale: Optional[float] = None,
                   length_scale: Optional[float] = None, noise_w: Optional[float] = None) -> tuple[np.ndarray, int]:
        """float32 audio in [-1, 1] and its sample rate; None scales take the voice's `inference` defaults."""
        pieces = [sentence.audio for sentence in self.stream(text, speaker, noise_scale=noise_scale,
                                                             length_scale=length_scale, noise_w=noise_w)]
        return np.concatenate(pieces), self.sample_rate

    def stream(self, text: str, speaker: Optional[str] = None, *, noise_scale: Optional[float] = None,
               length_scale: Optional[float] = None, noise_w: Optional[float] = None) -> Iterator[SpokenSentence]:
        """The sentences of `text`, spoken one at a time (one graph call each), in order."""
        scales = self.scales(noise_scale, length_scale, noise_w)
        speaker_id = self.speaker_id(speaker)
        sentences = self.frontend.split_sentences(text)
        encoded = self.frontend.encode_batch(sentences)
        unknown = sorted({symbol for item in encoded for symbol in item.unknown})
        if unknown:
            logger.warning("Left out %d phoneme(s) %s has no id for: %s", len(unknown), self.piper.path,
                           " ".join(unknown))
        spoken = [(sentence, item) for sentence, item in zip(sentences, encoded) if item.phonemes.strip()]
        if not spoken:
            raise UserInputError("No text to speak: the text has no words to read.")
        if len(spoken) < len(sentences):
            logger.info("%d of %d sentence(s) have nothing to say (punctuation only) and are left out.",
                        len(sentences) - len(spoken), len(sentences))
        for sentence, item in spoken:
            yield SpokenSentence(sentence, item.phonemes, item.ids, self.run_graph(item.ids, speaker_id, scales))

    def scales(self, noise_scale: Optional[float], length_scale: Optional[float],
               noise_w: Optional[float]) -> np.ndarray:
        """The graph's `scales` input, float32 [3] = [noise_scale, length_scale, noise_w], defaults filled in."""
        values = (self.piper.noise_scale if noise_scale is None else noise_scale,
                  self.piper.length_scale if length_scale is None else length_scale,
                  self.piper.noise_w if noise_w is None else noise_w)
        if not values[1] > 0:
            raise UserInputError(f"length scale must be above 0 (1 is normal speed); got {values[1]}.")
        if not (values[0] >= 0 and values[2] >= 0):
            raise UserInputError(f"noise scale and noise w must be at least 0; got {values[0]} and {values[2]}.")
        return np.array(values, dtype=np.float32)

    def run_graph(self, phoneme_ids: list[int], speaker_id: Optional[int], scales: np.ndarray) -> np.ndarray:
        """One sentence's ids -> float32 audio [samples], clipped to [-1, 1] (the count is logged)."""
        feeds = {"input": np.array([phoneme_ids], dtype=np.int64),
                 "input_lengths": np.array([len(phoneme_ids)], dtype=np.int64), "scales": scales}
        if speaker_id is not None:
            feeds["sid"] = np.array([speaker_id], dtype=np.int64)
        audio = self.session.run(None, feeds)[0].reshape(-1).astype(np.float32, copy=False)
        clipped = int(np.count_nonzero(np.abs(audio) > 1.0))
        if clipped:
            logger.warning("%d sample(s) beyond full scale were clipped.", clipped)
        return np.clip(audio, -1.0, 1.0)


def _open_session(path: Path, threads: Optional[int]):
    try:
        import onnxruntime
    except ImportError:
        raise UserInputError("Speaking ONNX voices needs onnxruntime: pip install 'voicesmith[export]'.") from None
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads or 0
    options.inter_op_num_threads = 1
    # Idle worker threads sleep instead of spin-waiting between operations. On a machine with other work
    # running, spinning threads steal the cores the others need: measured on 2 shared cores, the same
    # sentences took 1.45x longer with spinning (benchmarks/RESULTS_onnx.md).
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    try:
        return onnxruntime.InferenceSession(str(path), sess_options=options, providers=["CPUExecutionProvider"])
    except Exception as error:  # onnxruntime raises its own types for unreadable or invalid graphs
        raise UserInputError(f"{path} is not an ONNX graph onnxruntime can load ({error}).") from None


def check_graph(path: Path, piper: PiperConfig, session) -> None:
    """Refuse a config that disagrees with its graph, before it fails mid-sentence."""
    inputs = {item.name for item in session.get_inputs()}
    missing = [name for name in GRAPH_INPUTS if name not in inputs]
    if missing:
        raise UserInputError(f"{path} lacks the Piper inputs {missing} (it has {sorted(inputs)}); it is not a "
                             f"Piper voice.")
    if ("sid" in inputs) != (piper.num_speakers > 1):
        has = "takes a speaker id (sid)" if "sid" in inputs else "takes no speaker id (sid)"
        raise UserInputError(f"{piper.path} says num_speakers is {piper.num_speakers}, but the graph {path} {has}. "
                             f"The config belongs to another voice; use the .onnx.json exported with this graph.")
    for key, graph_rows in _table_sizes(path).items():
        if graph_rows != getattr(piper, key):
            raise UserInputError(f"{piper.path} says {key} is {getattr(piper, key)}, but the graph {path} has "
                                 f"{graph_rows}. The config belongs to another voice; use the .onnx.json "
                                 f"exported with this graph.")


def _table_sizes(path: Path) -> dict[str, int]:
    """Rows of the tables the graph looks `input` and `sid` up in (its symbol and speaker embeddings)."""
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    tables = {table.name: int(table.dims[0]) for table in graph.initializer if len(table.dims) == 2}
    sizes = {}
    for node in graph.node:
        if node.op_type == "Gather" and len(node.input) == 2 and node.input[0] in tables:
            key = {"input": "num_symbols", "sid": "num_speakers"}.get(node.input[1])
            if key:
                sizes[key] = tables[node.input[0]]
    if "num_symbols" not in sizes:
        logger.warning("%s: found no symbol table looked up by `input`; num_symbols is not checked.", path)
    return sizes


# --- `voicesmith synth VOICE.onnx` ---------------------------------------------------------------

def synth_command(model_path: Path, text: str, out: Path, speaker: Optional[str] = None,
                  length_scale: Optional[float] = None, noise_scale: Optional[float] = None,
                  noise_w: Optional[float] = None) -> int:
    """Speak into a 16-bit WAV sentence by sentence (memory stays one sentence), then print speed."""
    import soundfile as sf

    voice = OnnxVoice.load(model_path)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp, samples, start = temporary_path(out), 0, time.perf_counter()
    try:
        with sf.SoundFile(str(tmp), "w", samplerate=voice.sample_rate, channels=1, subtype="PCM_16",
                          format="WAV") as wav:
            for sentence in voice.stream(text, speaker, noise_scale=noise_scale, length_scale=length_scale,
                                         noise_w=noise_w):
                wav.write(sentence.audio)
                samples += len(sentence.audio)
        tmp.replace(out)
    finally:
        tmp.unlink(missing_ok=True)
    elapsed, seconds = time.perf_counter() - start, samples / voice.sample_rate
    print(f"{out}: {seconds:.2f} s of audio, synthesised in {elapsed:.2f} s "
          f"(real-time factor {elapsed / max(seconds, 1e-9):.3f})")
    return 0
