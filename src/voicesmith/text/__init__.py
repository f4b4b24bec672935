"""Text front end: normalisation, espeak-ng phonemes or characters, Piper-style symbol ids.

A leaf package: it imports nothing of voicesmith but config types and errors.
"""

from voicesmith.text.frontend import EncodedText, TextFrontend, build_symbol_table
from voicesmith.text.normalize import normalize_text
from voicesmith.text.phonemize import Phonemizer
from voicesmith.text.symbols import SymbolTable

__all__ = ["EncodedText", "Phonemizer", "SymbolTable", "TextFrontend", "build_symbol_table", "normalize_text"]
