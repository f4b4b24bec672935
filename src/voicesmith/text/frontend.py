"""Text -> ids in one place, so training data and synthesis can never disagree.

The cache builder and the synthesizer both call `TextFrontend.encode`; the
symbol table comes from the run, never rebuilt, so ids cannot shift.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable

from voicesmith.config import TextConfig
from voicesmith.errors import ConfigError
from voicesmith.text.normalize import TITLES, collapse_whitespace, normalize_text
from voicesmith.text.phonemize import Phonemizer
from voicesmith.text.symbols import SymbolTable

_SENTENCE_END_RE = re.compile(r"[.!?。！？]+[\"'”’)\]]*\s+")
_LAST_WORD_RE = re.compile(r"(\w+)\W*$")


@dataclass
class EncodedText:
    ids: list[int]
    phonemes: str
    unknown: list[str]
    normalized: str


def build_symbol_table(text_cfg: TextConfig, texts: Iterable[str]) -> SymbolTable:
    """The table a new run saves: Piper's espeak table, or the characters of the (normalised) corpus."""
    if text_cfg.phonemizer == "espeak":
        return SymbolTable.default()
    phonemizer = Phonemizer(text_cfg.language, "characters")
    return SymbolTable.for_characters(phonemizer.phonemize_batch([_normalize(text_cfg, text) for text in texts]))


def _normalize(text_cfg: TextConfig, text: str) -> str:
    return normalize_text(text, text_cfg.language) if text_cfg.normalize else collapse_whitespace(text)


class TextFrontend:
    """Normalise, phonemize and encode with a run's symbol table; picklable."""

    def __init__(self, text_cfg: TextConfig, table: SymbolTable) -> None:
        if table.kind != text_cfg.phonemizer:
            raise ConfigError(f"text.phonemizer is {text_cfg.phonemizer!r} but the run's symbol table was made "
                              f"for {table.kind!r}: the ids would not match. Set text.phonemizer: {table.kind} "
                              f"or start a new run (a new feature cache) for the other mode.")
        self.text_cfg = text_cfg
        self.table = table
        self.phonemizer = Phonemizer(text_cfg.language, text_cfg.phonemizer)

    def normalize(self, text: str) -> str:
        return _normalize(self.text_cfg, text)

    def encode(self, text: str) -> EncodedText:
        return self.encode_batch([text])[0]

    def encode_batch(self, texts: list[str]) -> list[EncodedText]:
        """Many texts at once: espeak-ng is called once for all of them."""
        normalized = [self.normalize(text) for text in texts]
        encoded = []
        for text, phonemes in zip(normalized, self.phonemizer.phonemize_batch(normalized)):
            ids, unknown = self.table.encode(phonemes)
            encoded.append(EncodedText(ids=ids, phonemes=phonemes, unknown=unknown, normalized=text))
        return encoded

    def split_sentences(self, text: str) -> list[str]:
        """Sentences of a long text, so each is synthesized with the length a model was trained on.

        Splits at line breaks and at . ! ? followed by a space, except after a
        title ("Dr. Smith") or a single-letter initial ("J. Smith").
        """
        sentences = []
        for paragraph in text.splitlines():
            start = 0
            for match in _SENTENCE_END_RE.finditer(paragraph):
                if not _ends_in_abbreviation(paragraph[start:match.end()]):
                    sentences.append(paragraph[start:match.end()])
                    start = match.end()
            sentences.append(paragraph[start:])
        return [sentence for sentence in map(collapse_whitespace, sentences) if sentence]


def _ends_in_abbreviation(sentence: str) -> bool:
    stripped = sentence.rstrip()
    if not stripped.endswith("."):
        return False
    match = _LAST_WORD_RE.search(stripped)
    if match is None:
        return False
    word = match.group(1)
    return word.lower() in TITLES or (len(word) == 1 and word.isupper())
