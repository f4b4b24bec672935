"""Text -> phoneme string: espeak-ng IPA through the bundled library, or plain characters.

espeak-ng keeps global state per loaded library, so the backend belongs to one
process: it is made on first use and dropped when the object is pickled (a
DataLoader worker builds its own). The output keeps stress marks and the
clause punctuation , . ! ? ; : (prosody depends on it; Piper keeps the same),
words separated by single spaces. No system espeak-ng is needed.
"""

from __future__ import annotations

import difflib
import logging
import re
import threading
from typing import Literal

from voicesmith.errors import ConfigError
from voicesmith.text.normalize import collapse_whitespace
from voicesmith.text.symbols import characters_of

PhonemizerMode = Literal["espeak", "characters"]

CLAUSE_PUNCTUATION = ",.!?;:"
# Said the same as a clause mark, so written the same before espeak sees them.
_PUNCTUATION_ALIASES = str.maketrans({"…": ".", "—": ",", "–": ",", "，": ",", "、": ",", "。": ".",
                                      "！": "!", "？": "?", "；": ";", "：": ":"})
# Marks phonemizer lifts out before espeak and puts back after; those not clause marks are then dropped.
_QUOTES_AND_BRACKETS = "¡¿\"«»“”„(){}[]"
_LIFTED_MARKS = CLAUSE_PUNCTUATION + _QUOTES_AND_BRACKETS
_DROPPED_MARKS = str.maketrans("", "", _QUOTES_AND_BRACKETS)
_SPACE_BEFORE_MARK_RE = re.compile(r"\s+([" + re.escape(CLAUSE_PUNCTUATION) + r"])")
_REPEATED_MARK_RE = re.compile(r"([" + re.escape(CLAUSE_PUNCTUATION) + r"])\1+")


def _quiet_logger() -> logging.Logger:
    logger = logging.getLogger("voicesmith.phonemizer")
    logger.setLevel(logging.ERROR)
    return logger


def _espeak_backend(language: str):
    """phonemizer's espeak backend on the espeakng-loader library and data."""
    from phonemizer.backend import EspeakBackend
    from phonemizer.backend.espeak.wrapper import EspeakWrapper

    from voicesmith.text.espeak import data_path, library_path

    EspeakWrapper.set_library(str(library_path()))
    EspeakWrapper.set_data_path(str(data_path()))
    try:
        return EspeakBackend(language, punctuation_marks=_LIFTED_MARKS, preserve_punctuation=True,
                             with_stress=True, language_switch="remove-flags", logger=_quiet_logger())
    except RuntimeError as error:
        known = sorted(EspeakBackend.supported_languages())
        close = difflib.get_close_matches(language, known, n=5, cutoff=0.5)
        hint = f" Close matches: {', '.join(close)}." if close else ""
        raise ConfigError(
            f"text.language is {language!r}, which espeak-ng cannot phonemize ({error}).{hint} Use one of "
            f"espeak-ng's {len(known)} language codes (e.g. en-us, en-gb, de, fr-fr, es, it, pt-br, ru, cmn), "
            f"or set text.phonemizer: characters for a language espeak-ng lacks.") from error


def _tidy(phonemes: str) -> str:
    """Keep only clause punctuation, attached to the word before it, once."""
    phonemes = phonemes.translate(_DROPPED_MARKS)
    phonemes = _SPACE_BEFORE_MARK_RE.sub(r"\1", phonemes)
    phonemes = _REPEATED_MARK_RE.sub(r"\1", phonemes)
    return collapse_whitespace(phonemes)


class Phonemizer:
    """Phonemes for one language; picklable, so datasets can carry it into worker processes."""

    def __init__(self, language: str, mode: PhonemizerMode = "espeak") -> None:
        if mode not in ("espeak", "characters"):
            raise ConfigError(f"text.phonemizer is {mode!r}; use 'espeak' or 'characters'.")
        self.language = language
        self.mode = mode
        self._backend = None
        self._lock = threading.Lock()
        if mode == "espeak":
            self._espeak()  # a wrong language code fails here, where the config is read, not in a worker

    def __getstate__(self) -> dict:
        return {"language": self.language, "mode": self.mode}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state, _backend=None, _lock=threading.Lock())

    def _espeak(self):
        if self._backend is None:
            self._backend = _espeak_backend(self.language)
        return self._backend

    def phonemize(self, text: str) -> str:
        return self.phonemize_batch([text])[0]

    def phonemize_batch(self, texts: list[str]) -> list[str]:
        """Phonemes of many texts in one espeak call (much faster than one by one)."""
        cleaned = [collapse_whitespace(text.translate(_PUNCTUATION_ALIASES)) for text in texts]
        if self.mode == "characters":
            return [characters_of(text) for text in cleaned]
        # phonemizer drops empty lines, which would shift every later result: leave them out here
        spoken = [index for index, text in enumerate(cleaned) if text]
        from phonemizer.separator import Separator

        with self._lock:
            results = self._espeak().phonemize([cleaned[index] for index in spoken],
                                               separator=Separator(phone="", syllable="", word=" "), strip=True)
        if len(results) != len(spoken):
            raise RuntimeError(f"espeak-ng returned {len(results)} lines for {len(spoken)} texts")
        phonemes = [""] * len(texts)
        for index, result in zip(spoken, results):
            phonemes[index] = _tidy(result)
        return phonemes
