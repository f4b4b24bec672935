"""Text normalisation: what a reader says for digits, symbols and abbreviations.

espeak-ng reads digits itself, but the character mode has no such reader, and
a written-out form keeps both modes consistent ("$5" is "five dollars", never
"dollar five"). English gets the full treatment; other languages only have
their whitespace tidied, because a wrong expansion is worse than none.
Everything is table-driven so a rule is one line to read or change.
"""

from __future__ import annotations

import re

_ONES = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven",
         "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen")
_TENS = ("", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety")
_SCALES = ((10**12, "trillion"), (10**9, "billion"), (10**6, "million"), (1000, "thousand"))
_ORDINAL_WORDS = {"one": "first", "two": "second", "three": "third", "five": "fifth", "eight": "eighth",
                  "nine": "ninth", "twelve": "twelfth"}
_LARGEST_SPOKEN = 10**15  # beyond this, digits are read one by one

TITLES = {
    "mr": "mister", "mrs": "missus", "ms": "miz", "dr": "doctor", "st": "saint", "prof": "professor",
    "rev": "reverend", "hon": "honourable", "gen": "general", "capt": "captain", "col": "colonel",
    "lt": "lieutenant", "sgt": "sergeant", "maj": "major", "gov": "governor", "mt": "mount", "ft": "fort",
}
"""Abbreviations that stand before a name, so their period never ends a sentence. "St." is one of them for
sentence splitting, but `_expand_saint_or_street` reads it first: after a name it is "Street"."""

ABBREVIATIONS = {
    **TITLES, "jr": "junior", "sr": "senior", "co": "company", "ltd": "limited", "inc": "incorporated",
    "vs": "versus", "etc": "et cetera", "approx": "approximately", "dept": "department",
}
"""Written forms (lowercase, without the period) and what is said for them. The period stays where the
text ends, and after a non-title when a capital follows ("... pears, etc. Then ...")."""

_CURRENCIES = {"$": ("dollar", "dollars", "cent", "cents"), "£": ("pound", "pounds", "penny", "pence"),
               "€": ("euro", "euros", "cent", "cents")}
_SYMBOLS = {"&": " and ", "%": " percent", "+": " plus ", "@": " at "}

_ABBREVIATION_RE = re.compile(r"\b(" + "|".join(ABBREVIATIONS) + r")\.(?=\s|$)(?=(\s*$)?)(?=(\s+[A-Z])?)",
                              re.IGNORECASE)
_SAINT_OR_STREET_RE = re.compile(r"\b(st)\.", re.IGNORECASE)
_PREVIOUS_WORD_RE = re.compile(r"(\w+)(\W*)$")
_NEXT_WORD_RE = re.compile(r"\s+(\w)")
_SENTENCE_START_RE = re.compile(r"(^|[.!?]\s+)$")
_LATIN_RE = re.compile(r"\b(e\.g\.|i\.e\.)", re.IGNORECASE)
_LATIN = {"e.g.": "for example", "i.e.": "that is"}
_THOUSANDS_RE = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")
_CURRENCY_RE = re.compile(r"([$£€])(\d+(?:\.\d+)?)(?:\s*(thousand|million|billion|trillion)\b)?")
_ORDINAL_RE = re.compile(r"\b(\d+)(st|nd|rd|th)\b", re.IGNORECASE)
_DECIMAL_RE = re.compile(r"\b(\d+)\.(\d+)\b")
_DECADES_RE = re.compile(r"\b(\d+)'?s\b")
_NUMBER_RE = re.compile(r"\d+")
_WHITESPACE_RE = re.compile(r"\s+")


def number_to_words(number: int) -> str:
    """Cardinal English words for a non-negative integer ("one hundred twenty-three")."""
    if number >= _LARGEST_SPOKEN:
        return " ".join(_ONES[int(digit)] for digit in str(number))
    if number < 20:
        return _ONES[number]
    if number < 100:
        tens, ones = divmod(number, 10)
        return _TENS[tens] + (f"-{_ONES[ones]}" if ones else "")
    if number < 1000:
        hundreds, rest = divmod(number, 100)
        return f"{_ONES[hundreds]} hundred" + (f" {number_to_words(rest)}" if rest else "")
    for scale, name in _SCALES:
        if number >= scale:
            count, rest = divmod(number, scale)
            return f"{number_to_words(count)} {name}" + (f" {number_to_words(rest)}" if rest else "")
    raise AssertionError("unreachable: every number >= 1000 has a scale")


def ordinal_to_words(number: int) -> str:
    """"twenty-first", "one hundredth": the last word of the cardinal becomes ordinal."""
    words = number_to_words(number)
    head, separator, last = words.rpartition("-" if "-" in words.split(" ")[-1] else " ")
    if last in _ORDINAL_WORDS:
        last = _ORDINAL_WORDS[last]
    elif last.endswith("y"):
        last = last[:-1] + "ieth"
    else:
        last += "th"
    return head + separator + last


def year_to_words(year: int) -> str:
    """How a year is said: 1990 "nineteen ninety", 1905 "nineteen oh five", 2007 "two thousand seven"."""
    if year % 1000 == 0 or 2000 < year < 2010 or not 1000 < year < 10000:
        return number_to_words(year)
    century, rest = divmod(year, 100)
    if rest == 0:
        return f"{number_to_words(century)} hundred"
    return f"{number_to_words(century)} " + (f"oh {_ONES[rest]}" if rest < 10 else number_to_words(rest))


def _expand_currency(match: re.Match) -> str:
    symbol, amount, scale = match.groups()
    unit, units, subunit, subunits = _CURRENCIES[symbol]
    if scale:  # "$2.5 million" -> "two point five million dollars"
        return f"{_expand_decimal_text(amount)} {scale} {units}"
    whole, _, fraction = amount.partition(".")
    whole_value = int(whole)
    cents = int((fraction + "00")[:2]) if fraction else 0
    parts = []
    if whole_value or not cents:
        parts.append(f"{number_to_words(whole_value)} {unit if whole_value == 1 else units}")
    if cents:
        parts.append(f"{number_to_words(cents)} {subunit if cents == 1 else subunits}")
    return " and ".join(parts)


def _expand_decimal_text(text: str) -> str:
    whole, _, fraction = text.partition(".")
    spoken = number_to_words(int(whole))
    if fraction:
        spoken += " point " + " ".join(_ONES[int(digit)] for digit in fraction)
    return spoken


def _expand_decades(match: re.Match) -> str:
    """"1990s" -> "nineteen nineties", "80's" -> "eighties"."""
    words = _number_words(match.group(1))
    return words[:-1] + "ies" if words.endswith("y") else words + "s"


def _number_words(digits: str) -> str:
    """A bare digit run: four digits between 1001 and 2099 are read as a year."""
    value = int(digits)
    if len(digits) == 4 and 1000 < value < 2100:
        return year_to_words(value)
    return number_to_words(value)


def _expand_abbreviation(match: re.Match) -> str:
    written, text_ends, capital_follows = match.group(1), match.group(2) is not None, match.group(3) is not None
    spoken = ABBREVIATIONS[written.lower()]
    spoken = spoken.capitalize() if written[0].isupper() else spoken
    sentence_ends = text_ends or (capital_follows and written.lower() not in TITLES)
    return spoken + "." if sentence_ends else spoken


def _expand_saint_or_street(match: re.Match) -> str:
    """"St." before a name is Saint ("St. Mark's"), after one Street ("Main St."): a capitalised word
    before it that does not start a sentence is a name, and a capital after it opens a name."""
    text, written = match.string, match.group(1)
    previous = _PREVIOUS_WORD_RE.search(text, 0, match.start())
    follows = _NEXT_WORD_RE.match(text, match.end())
    capital_follows = follows is not None and follows.group(1).isupper()
    after_name = (previous is not None and previous.group(1)[0].isupper() and not previous.group(2).strip()
                  and not _SENTENCE_START_RE.search(text, 0, previous.start()))
    if capital_follows and not after_name:
        return "Saint" if written[0].isupper() else "saint"
    street = "Street" if written[0].isupper() else "street"
    text_ends = not text[match.end():].strip()
    return street + "." if text_ends or capital_follows else street


def collapse_whitespace(text: str) -> str:
    return _WHITESPACE_RE.sub(" ", text).strip()


def normalize_english(text: str) -> str:
    text = _LATIN_RE.sub(lambda match: _LATIN[match.group(1).lower()], text)
    text = _SAINT_OR_STREET_RE.sub(_expand_saint_or_street, text)
    text = _ABBREVIATION_RE.sub(_expand_abbreviation, text)
    text = _THOUSANDS_RE.sub("", text)
    text = _CURRENCY_RE.sub(_expand_currency, text)
    text = _ORDINAL_RE.sub(lambda match: ordinal_to_words(int(match.group(1))), text)
    text = _DECIMAL_RE.sub(lambda match: _expand_decimal_text(match.group(0)), text)
    text = _DECADES_RE.sub(_expand_decades, text)
    text = _NUMBER_RE.sub(lambda match: _number_words(match.group(0)), text)
    for symbol, spoken in _SYMBOLS.items():
        text = text.replace(symbol, spoken)
    return collapse_whitespace(text)


def normalize_text(text: str, language: str) -> str:
    """Written-out text for an espeak-ng language code ("en-us", "de", ...)."""
    if language.lower().startswith("en"):
        return normalize_english(text)
    return collapse_whitespace(text)
