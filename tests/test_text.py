"""Text front end: normalisation, espeak-ng phonemes, Piper symbol ids, characters mode."""

from __future__ import annotations

import multiprocessing
import pickle
import re
import unicodedata

import pytest

from voicesmith.config import TextConfig
from voicesmith.errors import ConfigError, UserInputError
from voicesmith.text import Phonemizer, SymbolTable, TextFrontend, build_symbol_table, normalize_text
from voicesmith.text.normalize import number_to_words, ordinal_to_words

# ------------------------------------------------------------------ normalisation


@pytest.mark.parametrize("written, spoken", [
    ("Mr. Smith met Dr. Jones on St. Mark's day.", "Mister Smith met Doctor Jones on Saint Mark's day."),
    ("It cost $5.", "It cost five dollars."),
    ("$1 and $0.01 and $3.50", "one dollar and one cent and three dollars and fifty cents"),
    ("a $2.5 million deal", "a two point five million dollars deal"),
    ("£20 or €1,000", "twenty pounds or one thousand euros"),
    ("In 1990, 1905, 1900, 2000, 2007 and 2019.",
     "In nineteen ninety, nineteen oh five, nineteen hundred, two thousand, two thousand seven and twenty nineteen."),
    ("the 1st, 2nd, 3rd, 12th, 21st and 100th", "the first, second, third, twelfth, twenty-first and one hundredth"),
    ("pi is 3.14 and 50% of 7% is 3.5%",
     "pi is three point one four and fifty percent of seven percent is three point five percent"),
    ("12,345 people and 7 cats", "twelve thousand three hundred forty-five people and seven cats"),
    ("the 1990s and the 80s", "the nineteen nineties and the eighties"),
    ("apples, pears, etc. Then we left.", "apples, pears, et cetera. Then we left."),
    ("He lives on Main St.", "He lives on Main Street."),
    ("St. Louis is far from 5 Elm St. in Dover.", "Saint Louis is far from five Elm Street in Dover."),
    ("Walk down Main St. Then turn on St. John's Rd.", "Walk down Main Street. Then turn on Saint John's Rd."),
    ("In St. Paul the st. was wet.", "In Saint Paul the street was wet."),
    ("cats, e.g. lions & tigers", "cats, for example lions and tigers"),
    ("  lots \t of\n\nspace  ", "lots of space"),
])
def test_english_normalisation(written, spoken):
    assert normalize_text(written, "en-us") == spoken


def test_other_languages_only_tidy_whitespace():
    assert normalize_text("  Ich  habe 5 Äpfel.\n", "de") == "Ich habe 5 Äpfel."


def test_number_words_cover_every_number_without_digits():
    words = [number_to_words(n) for n in range(0, 100_000, 7)]
    assert len(set(words)) == len(words)
    assert not any(re.search(r"\d", w) for w in words)
    assert number_to_words(1_234_567) == "one million two hundred thirty-four thousand five hundred sixty-seven"
    assert ordinal_to_words(1_000_001) == "one million first"


# ------------------------------------------------------------------ phonemes


@pytest.fixture(scope="module")
def english() -> Phonemizer:
    return Phonemizer("en-us")


def test_espeak_phonemes_keep_stress_words_and_clause_punctuation(english):
    phonemes = english.phonemize("Hello, world! How are you today?")
    assert "ˈ" in phonemes and "ˌ" in phonemes
    assert phonemes.count(" ") == 5 and "  " not in phonemes
    assert [c for c in phonemes if c in ",.!?;:"] == [",", "!", "?"]
    assert phonemes.endswith("?") and not re.search(r"[A-Z0-9]", phonemes)


def test_other_punctuation_becomes_a_clause_mark_or_goes(english):
    phonemes = english.phonemize('The (quick) «brown» fox — "again"… really')
    assert not set(phonemes) & set('()«»"—…')
    assert re.search(r"\S, \S", phonemes) and "." in phonemes  # the dash is a comma, the ellipsis a period
    assert " ," not in phonemes and " ." not in phonemes


def test_batch_is_aligned_deterministic_and_equals_single_calls(english):
    texts = ["One thing.", "", "   ", "Two things!", "!", "Three."]
    batch = english.phonemize_batch(texts)
    assert len(batch) == len(texts) and batch[1] == batch[2] == ""
    assert batch == [english.phonemize(text) for text in texts]
    assert batch == english.phonemize_batch(texts)


def test_espeak_comes_from_the_bundled_library(english):
    from voicesmith.text.espeak import library_path

    english.phonemize("warm up")
    assert english._espeak()._espeak.library_path.resolve() == library_path().resolve()


def test_other_languages_phonemize():
    german, french = Phonemizer("de"), Phonemizer("fr-fr")
    assert german.phonemize("Guten Tag, wie geht es?").count(",") == 1
    nasal = french.phonemize("Bonjour, le monde.")
    assert "\u0303" in unicodedata.normalize("NFD", nasal)  # French nasal vowels carry a combining tilde


def test_unknown_language_is_a_config_error_with_suggestions():
    with pytest.raises(ConfigError, match="en-us"):
        Phonemizer("en-usa")
    with pytest.raises(ConfigError, match="characters"):
        Phonemizer("en-us", mode="letters")


def test_phonemizer_pickles_without_its_backend(english):
    data = pickle.dumps(english)
    assert len(data) < 300
    assert pickle.loads(data).phonemize("Hello there.") == english.phonemize("Hello there.")


def _phonemize_in_worker(phonemizer: Phonemizer) -> str:
    return phonemizer.phonemize("A fresh process.")


def test_phonemizer_works_in_a_spawned_process(english):
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        assert pool.apply(_phonemize_in_worker, (english,)) == english.phonemize("A fresh process.")


def test_character_mode_is_nfd_text():
    phonemizer = Phonemizer("xx", mode="characters")  # no espeak voice needed
    assert phonemizer.phonemize("  Café  au lait ") == unicodedata.normalize("NFD", "Café au lait")


# ------------------------------------------------------------------ symbol tables


def test_default_table_is_pipers():
    table = SymbolTable.default()
    id_map = table.phoneme_id_map
    assert len(table) == 159
    assert [id_map[s][0] for s in "_^$ !'(),-.:;?"] == list(range(14))
    # spot checks against piper-phonemize's DEFAULT_PHONEME_ID_MAP
    facts = {"a": 14, "z": 38, "æ": 39, "ə": 59, "ɡ": 66, "ɹ": 88, "ʃ": 96, "ˈ": 120, "ˌ": 121, "ː": 122,
             "θ": 126, "ⱱ": 129, "0": 130, "\u0327": 140, "\u0303": 141, "ʰ": 145, "g": 154, "X": 156,
             "\u030a": 158}
    assert {symbol: id_map[symbol][0] for symbol in facts} == facts
    all_ids = sorted(ids[0] for ids in id_map.values())
    assert all_ids == list(range(159)) and all(len(ids) == 1 for ids in id_map.values())


def test_every_phoneme_of_real_text_is_in_the_default_table(demo_corpus):
    texts = [line.split("|")[1] for line in (demo_corpus / "metadata.csv").read_text("utf-8").splitlines()]
    frontend = TextFrontend(TextConfig(), SymbolTable.default())
    encoded = frontend.encode_batch(texts)
    assert all(item.unknown == [] for item in encoded), [item.unknown for item in encoded if item.unknown]
    german = TextFrontend(TextConfig(language="de"), SymbolTable.default())
    assert german.encode("Die Bäcker öffnen früh, nicht wahr?").unknown == []


def test_encode_intersperses_pads_and_reports_unknown_symbols():
    table = SymbolTable.default()
    ids, unknown = table.encode("hə ç☃_")
    pad, bos, eos = (table.phoneme_id_map[s][0] for s in "_^$")
    symbols = [table.phoneme_id_map[s][0] for s in ("h", "ə", " ", "c", "\u0327")]  # ç is c + cedilla (NFD)
    assert ids == [bos, pad] + [i for s in symbols for i in (s, pad)] + [eos]
    assert unknown == ["☃", "_"]
    assert table.decode(ids) == unicodedata.normalize("NFD", "hə ç")


def test_table_round_trips_and_bad_tables_are_refused(tmp_path):
    table = SymbolTable.for_characters(["Grüße"])
    table.save(tmp_path / "symbols.json")
    loaded = SymbolTable.load(tmp_path / "symbols.json")
    assert loaded == table and loaded.encode("grüße") == table.encode("grüße")
    assert SymbolTable.from_dict(SymbolTable.default().to_dict()) == SymbolTable.default()
    with pytest.raises(UserInputError, match="single character"):
        SymbolTable.from_dict({"phoneme_id_map": {"_": [0], "^": [1], "$": [2], "ab": [3]}})
    with pytest.raises(UserInputError, match="pad/begin/end"):
        SymbolTable.from_dict({"phoneme_id_map": {"a": [0]}})
    (tmp_path / "broken.json").write_text("{not json")
    with pytest.raises(UserInputError, match="broken.json"):
        SymbolTable.load(tmp_path / "broken.json")


def test_character_table_is_deterministic_and_case_insensitive():
    texts = ["Zebra crossing!", "Ärger über Öl", "zebra"]
    table = SymbolTable.for_characters(texts)
    assert table == SymbolTable.for_characters(list(reversed(texts)))
    id_map = table.phoneme_id_map
    assert [id_map[s][0] for s in "_^$ !'(),-.:;?"] == list(range(14))
    assert id_map["Z"] == id_map["z"] and id_map["A"] == id_map["a"]
    assert "\u0308" in table and "ä" not in table  # NFD: the umlaut is its own symbol
    assert len(table) == 14 + len({c for c in unicodedata.normalize("NFD", "zebracossingärgerüberöl")})
    assert table.encode("zq")[1] == ["q"]


# ------------------------------------------------------------------ front end


def test_frontend_normalises_phonemizes_and_encodes():
    frontend = TextFrontend(TextConfig(), SymbolTable.default())
    encoded = frontend.encode("Dr. Who paid $3.")
    assert encoded.normalized == "Doctor Who paid three dollars."
    assert (encoded.ids, encoded.unknown) == SymbolTable.default().encode(encoded.phonemes)
    assert encoded.phonemes == Phonemizer("en-us").phonemize(encoded.normalized)
    assert pickle.loads(pickle.dumps(frontend)).encode("Dr. Who paid $3.") == encoded


def test_character_frontend_end_to_end():
    cfg = TextConfig(language="de", phonemizer="characters")
    table = build_symbol_table(cfg, ["Grüße aus Köln!", "Tschüss."])
    encoded = TextFrontend(cfg, table).encode("Grüße, Köln?")
    assert encoded.unknown == [] and len(encoded.ids) == 2 * len(unicodedata.normalize("NFD", "Grüße, Köln?")) + 3
    assert TextFrontend(cfg, table).encode("Zoo").unknown == ["Z"]
    english = TextConfig(language="en-us", phonemizer="characters")
    seven = TextFrontend(english, build_symbol_table(english, ["7 cats"])).encode("7")
    assert (seven.phonemes, seven.unknown) == ("seven", [])  # the table holds the letters of the normalised text


def test_frontend_refuses_a_table_of_the_other_mode():
    with pytest.raises(ConfigError, match="symbol table"):
        TextFrontend(TextConfig(phonemizer="characters"), SymbolTable.default())


def test_split_sentences():
    frontend = TextFrontend(TextConfig(), SymbolTable.default())
    text = 'Dr. Smith went home. He said: "Hi!" Then J. R. Doe came.\nA new line? Yes. It was 5. Done'
    assert frontend.split_sentences(text) == [
        "Dr. Smith went home.", 'He said: "Hi!"', "Then J. R. Doe came.", "A new line?", "Yes.", "It was 5.", "Done"]
    assert frontend.split_sentences(" \n ") == []
