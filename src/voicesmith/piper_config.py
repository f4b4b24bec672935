"""The Piper voice config (`NAME.onnx.json`): read with clear errors, written for exports.

A Piper voice is `NAME.onnx` plus `NAME.onnx.json`; the config says how text becomes the
graph's ids (espeak-ng voice, phoneme type, phoneme_id_map) and which scales and speakers
the graph takes. The keys and defaults are those the current Piper runtime reads
(../shared/reference/piper-voice-format.md). Voices exported by voicesmith carry one more
block, `voicesmith`, with the run's config; no Piper runtime reads it, and it tells
voicesmith's own synthesizer how the voice was trained to read text.

Standard library and voicesmith's torch-free config and text modules only: loading a voice
for onnxruntime never imports torch.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional

from voicesmith.config import TextConfig
from voicesmith.errors import UserInputError
from voicesmith.text.symbols import BOS, EOS, PAD, SymbolTable

DEFAULT_NOISE_SCALE = 0.667
DEFAULT_LENGTH_SCALE = 1.0
DEFAULT_NOISE_W = 0.8
DEFAULT_HOP_LENGTH = 256
REQUIRED_KEYS = ("num_symbols", "num_speakers", "audio.sample_rate", "espeak.voice", "phoneme_id_map")
PHONEMIZER_OF_TYPE = {"espeak": "espeak", "text": "characters"}
"""Piper's `phoneme_type` -> voicesmith's `text.phonemizer`, for the types voicesmith can read."""


def config_path_for(onnx_path: Path) -> Path:
    """Where the runtime looks for a voice's config: the .onnx path plus `.json`."""
    return Path(f"{onnx_path}.json")


@dataclass(frozen=True)
class PiperConfig:
    """What a Piper voice config says, checked: ids, scales, speakers, and how to read text."""

    path: Path
    num_symbols: int
    num_speakers: int
    sample_rate: int
    espeak_voice: str
    phoneme_type: str  # "espeak" or "text"
    phoneme_id_map: dict[str, list[int]]
    speaker_id_map: dict[str, int] = field(default_factory=dict)
    noise_scale: float = DEFAULT_NOISE_SCALE
    length_scale: float = DEFAULT_LENGTH_SCALE
    noise_w: float = DEFAULT_NOISE_W
    hop_length: int = DEFAULT_HOP_LENGTH
    default_speaker_id: int = 0
    vowel_clusters: bool = False  # newer voices merge e.g. "a" "ɪ" into one id; voicesmith does not
    voicesmith: dict = field(default_factory=dict)  # the exporting run's block, {} for other voices

    @property
    def symbols(self) -> SymbolTable:
        return SymbolTable(self.phoneme_id_map, kind=PHONEMIZER_OF_TYPE[self.phoneme_type])

    @property
    def text_config(self) -> TextConfig:
        """How to read text: the exporting run's text settings, else voicesmith's defaults for this language."""
        stored = self.voicesmith.get("config", {}).get("text")
        if stored:
            return TextConfig(**stored)
        return TextConfig(language=self.espeak_voice, phonemizer=PHONEMIZER_OF_TYPE[self.phoneme_type])


def read_piper_config(path: Path) -> PiperConfig:
    """Read and check `path`; every problem is a UserInputError naming the file and the key."""
    path = Path(path)
    data = _read_json(path)
    reader = _Reader(data, path)
    num_symbols = reader.integer("num_symbols", minimum=1)
    num_speakers = reader.integer("num_speakers", minimum=1)
    phoneme_type = reader.optional("phoneme_type", "espeak")
    if phoneme_type not in PHONEMIZER_OF_TYPE:
        raise UserInputError(f"{path}: phoneme_type is {phoneme_type!r}; voicesmith reads 'espeak' and 'text' "
                             f"voices. Speak this voice with the Piper runtime (`pip install piper-tts`).")
    inference = reader.optional("inference", {})
    return PiperConfig(
        path=path, num_symbols=num_symbols, num_speakers=num_speakers,
        sample_rate=reader.integer("audio.sample_rate", minimum=1000),
        espeak_voice=reader.string("espeak.voice"), phoneme_type=phoneme_type,
        phoneme_id_map=reader.phoneme_id_map(num_symbols),
        speaker_id_map=reader.speaker_id_map(num_speakers),
        noise_scale=reader.scale(inference, "noise_scale", DEFAULT_NOISE_SCALE),
        length_scale=reader.scale(inference, "length_scale", DEFAULT_LENGTH_SCALE, positive=True),
        noise_w=reader.scale(inference, "noise_w", DEFAULT_NOISE_W),
        hop_length=reader.integer("hop_length", minimum=1, default=DEFAULT_HOP_LENGTH),
        default_speaker_id=reader.integer("default_speaker_id", minimum=0, default=0, below=num_speakers),
        vowel_clusters=bool(data.get("vowel_clusters")),
        voicesmith=reader.block("voicesmith"))


def piper_config_dict(*, symbols: SymbolTable, speakers: Mapping[str, int], num_speakers: int, sample_rate: int,
                      language: str, hop_length: int, voicesmith: Optional[dict] = None,
                      noise_scale: float = DEFAULT_NOISE_SCALE, length_scale: float = DEFAULT_LENGTH_SCALE,
                      noise_w: float = DEFAULT_NOISE_W) -> dict:
    """The config the Piper runtime reads for a voice (plus the `voicesmith` block when given).

    `speakers` maps names to ids (the map is written only for `num_speakers` > 1).
    """
    config = {
        "audio": {"sample_rate": int(sample_rate)},
        "espeak": {"voice": language},
        "phoneme_type": symbols.piper_phoneme_type,
        "phoneme_id_map": symbols.phoneme_id_map,
        "num_symbols": len(symbols),
        "num_speakers": num_speakers,
        "speaker_id_map": {str(name): int(index) for name, index in speakers.items()} if num_speakers > 1 else {},
        "inference": {"noise_scale": noise_scale, "length_scale": length_scale, "noise_w": noise_w},
        "hop_length": int(hop_length),
    }
    if voicesmith is not None:
        config["voicesmith"] = voicesmith
    return config


def _read_json(path: Path) -> dict:
    if not path.is_file():
        raise UserInputError(f"The voice config {path} is missing. A Piper voice is two files, NAME.onnx and "
                             f"NAME.onnx.json, side by side; put the .onnx.json that came with the voice there.")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as error:
        raise UserInputError(f"{path} is not UTF-8 text ({error}); it is not a Piper voice config.") from None
    except json.JSONDecodeError as error:
        raise UserInputError(f"{path}, line {error.lineno} column {error.colno}: not valid JSON ({error.msg}). "
                             f"Use the .onnx.json that came with the voice.") from None
    if not isinstance(data, dict):
        raise UserInputError(f"{path} holds a JSON {type(data).__name__}, not an object; it is not a Piper "
                             f"voice config.")
    return data


class _Reader:
    """Typed access to a config's keys, each failure naming the file and the dotted key."""

    def __init__(self, data: dict, path: Path) -> None:
        self.data, self.path = data, path

    def _fail(self, key: str, problem: str) -> UserInputError:
        return UserInputError(f"{self.path}: {key} {problem}. A Piper voice config needs "
                              f"{', '.join(REQUIRED_KEYS)}; use the .onnx.json that came with the voice.")

    def required(self, key: str) -> Any:
        node: Any = self.data
        for part in key.split("."):
            if not isinstance(node, dict) or part not in node:
                raise self._fail(key, "is missing")
            node = node[part]
        return node

    def optional(self, key: str, default: Any) -> Any:
        value = self.data.get(key)
        return default if value is None else value

    def block(self, key: str) -> dict:
        """An optional object whose inner keys are voicesmith's own (the exporting run's config)."""
        value = self.optional(key, {})
        if not isinstance(value, dict) or not isinstance(value.get("config", {}), dict):
            raise self._fail(key, "is not an object with a `config` object; re-export the voice")
        return value

    def integer(self, key: str, minimum: int, default: Optional[int] = None, below: Optional[int] = None) -> int:
        value = self.required(key) if default is None else self.optional(key, default)
        if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
            raise self._fail(key, f"is {value!r}; expected an integer of at least {minimum}")
        if below is not None and value >= below:
            raise self._fail(key, f"is {value}; expected below {below}")
        return value

    def string(self, key: str) -> str:
        value = self.required(key)
        if not isinstance(value, str) or not value.strip():
            raise self._fail(key, f"is {value!r}; expected a non-empty string")
        return value

    def scale(self, inference: Any, key: str, default: float, positive: bool = False) -> float:
        if not isinstance(inference, dict):
            raise self._fail("inference", f"is {inference!r}; expected an object of scales")
        value = inference.get(key, default)
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        if not ok or value < 0 or (positive and value == 0):
            raise self._fail(f"inference.{key}", f"is {value!r}; expected a number "
                                                 f"{'above' if positive else 'of at least'} 0")
        return float(value)

    def phoneme_id_map(self, num_symbols: int) -> dict[str, list[int]]:
        mapping = self.required("phoneme_id_map")
        if not isinstance(mapping, dict) or not mapping:
            raise self._fail("phoneme_id_map", "is not a non-empty object of phoneme -> list of ids")
        for symbol, ids in mapping.items():
            valid = (isinstance(ids, list) and ids and all(
                isinstance(i, int) and not isinstance(i, bool) and 0 <= i < num_symbols for i in ids))
            if not symbol or not valid:
                raise self._fail(f"phoneme_id_map[{symbol!r}]", f"is {ids!r}; expected a non-empty list of ids "
                                                                f"from 0 to num_symbols - 1 = {num_symbols - 1}")
        missing = [symbol for symbol in (PAD, BOS, EOS) if symbol not in mapping]
        if missing:
            raise self._fail("phoneme_id_map", f"lacks the pad/begin/end symbols {missing}")
        return {symbol: list(ids) for symbol, ids in mapping.items()}

    def speaker_id_map(self, num_speakers: int) -> dict[str, int]:
        mapping = self.optional("speaker_id_map", {})
        if not isinstance(mapping, dict):
            raise self._fail("speaker_id_map", f"is {mapping!r}; expected an object of speaker name -> id")
        for name, index in mapping.items():
            if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < num_speakers:
                raise self._fail(f"speaker_id_map[{name!r}]", f"is {index!r}; expected an id from 0 to "
                                                              f"num_speakers - 1 = {num_speakers - 1}")
        return dict(mapping)
