"""Symbol tables in Piper's scheme: phoneme (one code point) -> ids.

The table is saved with every run and every voice, so the ids a model was
trained with are the ids it is fed at inference, whatever the code does later.
`SymbolTable.default()` is Piper's default espeak-ng table (ids 0..158), which
makes voicesmith voices id-compatible with the Piper runtime.
"""

from __future__ import annotations

import json
import unicodedata
from pathlib import Path
from typing import Iterable, Literal, Mapping, Sequence

from voicesmith.errors import UserInputError
from voicesmith.fileio import write_text

PAD, BOS, EOS, SPACE = "_", "^", "$", " "
SPECIAL = (PAD, BOS, EOS)

RESERVED = (PAD, BOS, EOS, SPACE, "!", "'", "(", ")", ",", "-", ".", ":", ";", "?")
"""Ids 0..13 in every table (Piper's layout): pad, begin, end, word break, punctuation."""

# Piper's DEFAULT_PHONEME_ID_MAP (piper-phonemize, src/phoneme_ids.hpp) in id order from 14.
# Note the ASCII "g" (154) apart from the IPA "ɡ" (66): espeak emits the latter; both are kept.
_PIPER_ESPEAK_SYMBOLS = (
    "abcdefhijklmnopqrstuvwxyz"  # 14..38 (Latin letters, no "g")
    # 39..129 IPA letters, stress and length marks
    "æçðøħŋœǀǁǂǃɐɑɒɓɔɕɖɗɘəɚɛɜɞɟɠɡɢɣɤɥɦɧɨɪɫɬɭɮɯɰɱɲɳɴɵɶɸɹɺɻɽɾʀʁʂʃʄʈʉʊʋʌʍʎʏʐʑʒʔʕʘʙʛʜʝʟʡʢʲˈˌːˑ˞βθχᵻⱱ"
    "0123456789"  # 130..139 tones
    "\u0327\u0303\u032a\u032f\u0329"  # 140..144 combining cedilla, tilde, bridge below, inverted breve, vertical line
    "ʰˤε↓#\"↑"  # 145..151 (# Icelandic, " Russian)
    "\u033a\u033b"  # 152..153 Basque: combining inverted bridge below, square below
    "gʦX"  # 154..156 Luxembourgish
    "\u031d\u030a"  # 157..158 Czech: combining up tack below, ring above
)

TableKind = Literal["espeak", "characters"]
_FORMAT = 1


def characters_of(text: str) -> str:
    """The symbols of a text in character mode: its code points after NFD (accents apart)."""
    return unicodedata.normalize("NFD", text)


class SymbolTable:
    """Phoneme -> ids, with pad/bos/eos interspersed the Piper way when encoding."""

    def __init__(self, phoneme_id_map: Mapping[str, Sequence[int]], kind: TableKind = "espeak") -> None:
        self._map = {symbol: list(ids) for symbol, ids in phoneme_id_map.items()}
        self.kind: TableKind = kind
        self._pad, self._bos, self._eos = (self._map[symbol] for symbol in SPECIAL)

    @classmethod
    def default(cls) -> SymbolTable:
        """Piper's default espeak-ng phoneme table (159 ids)."""
        symbols = RESERVED + tuple(_PIPER_ESPEAK_SYMBOLS)
        return cls({symbol: [index] for index, symbol in enumerate(symbols)}, kind="espeak")

    @classmethod
    def for_characters(cls, texts: Iterable[str]) -> SymbolTable:
        """A table of the characters the texts use (NFD), after Piper's reserved ids, in code point order.

        Upper and lower case share one id (the upper case is an alias), so a
        voice learns each letter from all its occurrences, while a runtime that
        feeds raw text (Piper's "text" phoneme type) still finds every letter.
        """
        reserved = set(RESERVED)
        letters = set()
        for text in texts:
            for char in characters_of(text):
                lower = char.lower()
                key = lower if len(lower) == 1 else char
                if key not in reserved and unicodedata.category(key)[0] != "C" and not key.isspace():
                    letters.add(key)
        phoneme_id_map = {symbol: [index] for index, symbol in enumerate(RESERVED)}
        for index, letter in enumerate(sorted(letters), start=len(RESERVED)):
            phoneme_id_map[letter] = [index]
            upper = letter.upper()
            if len(upper) == 1 and upper != letter and upper not in letters:
                phoneme_id_map[upper] = [index]
        return cls(phoneme_id_map, kind="characters")

    @property
    def phoneme_id_map(self) -> dict[str, list[int]]:
        return {symbol: list(ids) for symbol, ids in self._map.items()}

    @property
    def piper_phoneme_type(self) -> str:
        """The `phoneme_type` a Piper voice config names for this table."""
        return "espeak" if self.kind == "espeak" else "text"

    def __len__(self) -> int:
        """The number of ids (largest id + 1): the size of a model's symbol embedding."""
        return 1 + max(max(ids) for ids in self._map.values() if ids)

    def __contains__(self, symbol: str) -> bool:
        return symbol in self._map

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SymbolTable) and (self.kind, self._map) == (other.kind, other._map)

    def encode(self, phonemes: str) -> tuple[list[int], list[str]]:
        """`^ _ p1 _ p2 _ ... pn _ $` ids, and the symbols not in the table (each once, in order).
        Begin and end may map to no id at all (`[]`): imported transformers/MMS voices read `_ p1 _ ... pn _`.

        Unknown symbols are skipped, as Piper does, so one odd character never
        costs a whole utterance; the caller reports them. A literal pad, begin
        or end character in the input counts as unknown, never as a control id.
        """
        ids = self._bos + self._pad
        unknown: list[str] = []
        for symbol in unicodedata.normalize("NFD", phonemes):
            mapped = None if symbol in SPECIAL else self._map.get(symbol)
            if mapped is None:
                if symbol not in unknown:
                    unknown.append(symbol)
                continue
            ids.extend(mapped)
            ids.extend(self._pad)
        ids.extend(self._eos)
        return ids, unknown

    def decode(self, ids: Iterable[int]) -> str:
        """The symbols of ids (the first symbol of each id), without pad/begin/end: for pictures and debugging."""
        control_ids = set(self._pad + self._bos + self._eos)
        symbol_of: dict[int, str] = {}
        for symbol, symbol_ids in self._map.items():
            if len(symbol_ids) == 1:
                symbol_of.setdefault(symbol_ids[0], symbol)
        return "".join(symbol_of.get(int(i), "") for i in ids if int(i) not in control_ids)

    def to_dict(self) -> dict:
        return {"format": _FORMAT, "kind": self.kind, "num_symbols": len(self),
                "pad": PAD, "bos": BOS, "eos": EOS, "phoneme_id_map": self.phoneme_id_map}

    @classmethod
    def from_dict(cls, data: Mapping, source: str = "symbol table") -> SymbolTable:
        """Check and rebuild a table; `source` names where it came from in error messages."""
        kind = data.get("kind", "espeak") if isinstance(data, Mapping) else None
        phoneme_id_map = data.get("phoneme_id_map") if isinstance(data, Mapping) else None
        problem = _map_problem(phoneme_id_map)
        if kind not in ("espeak", "characters"):
            problem = f"its kind is {kind!r}; expected 'espeak' or 'characters'"
        if problem:
            raise UserInputError(f"The {source} is not a valid voicesmith/Piper symbol table: {problem}. "
                                 f"Use the symbols.json written by `voicesmith prepare` or the run it came from.")
        return cls(phoneme_id_map, kind=kind)

    def save(self, path: Path) -> None:
        """Write JSON atomically, so a crash never leaves a table that shifts ids."""
        write_text(Path(path), json.dumps(self.to_dict(), ensure_ascii=False, indent=1))

    @classmethod
    def load(cls, path: Path) -> SymbolTable:
        path = Path(path)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as error:
            raise UserInputError(f"Cannot read the symbol table {path}: {error}. Rebuild it with "
                                 f"`voicesmith prepare CONFIG` (it must match the model's training run).") from error
        return cls.from_dict(data, source=f"symbol table {path}")


def _map_problem(phoneme_id_map: object) -> str:
    """Why a phoneme_id_map cannot be used, or "" when it can."""
    if not isinstance(phoneme_id_map, Mapping) or not phoneme_id_map:
        return "phoneme_id_map is missing or empty"
    for symbol, ids in phoneme_id_map.items():
        if not isinstance(symbol, str) or len(symbol) != 1:
            return f"the key {symbol!r} is not a single character"
        if (not isinstance(ids, Sequence) or isinstance(ids, str) or (not ids and symbol not in (BOS, EOS))
                or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids)):
            return f"{symbol!r} maps to {ids!r}, not a list of non-negative integer ids"
    missing = [symbol for symbol in SPECIAL if symbol not in phoneme_id_map]
    if missing:
        return f"it lacks the pad/begin/end symbols {missing}"
    return ""
