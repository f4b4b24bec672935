"""A corpus spoken by the bundled espeak-ng: the test data of the whole project.

The first sentences are hand-written and varied (questions, lists, numbers in
words); beyond them a small seeded grammar composes more, so any size is
deterministic for a given N. Several speakers are espeak-ng voice variants.
"""

from __future__ import annotations

import random
from importlib import resources
from pathlib import Path

import numpy as np

SAMPLE_RATE = 22050
SPEAKER_VOICES = ("en-us", "en-us+f3", "en-us+m3", "en-us+f2", "en-us+m1", "en-us+f4")

_SUBJECTS = ("the old sailor", "my neighbour", "a tired student", "the young doctor", "our teacher",
             "the quiet painter", "a curious child", "the village baker", "her brother", "the night guard")
_BASE_FORMS = {"carried": "carry", "found": "find", "painted": "paint", "repaired": "repair",
               "noticed": "notice", "opened": "open", "described": "describe", "borrowed": "borrow",
               "collected": "collect", "cleaned": "clean"}
_VERBS = tuple(_BASE_FORMS)
_OBJECTS = ("a wooden chair", "the broken lamp", "an old letter", "a basket of apples", "the blue door",
            "a map of the coast", "the silver key", "a pile of books", "the garden hose", "a tiny bell")
_PLACES = ("near the station", "behind the church", "in the attic", "by the river", "at the market",
           "on the hill", "under the bridge", "in the kitchen", "beside the lake", "at the harbour")
_TIMES = ("this morning", "last winter", "before dinner", "after the storm", "on Sunday",
          "late at night", "at sunrise", "during the festival", "two days ago", "every spring")


def demo_sentences(n: int) -> list[str]:
    """The first n sentences of the demo corpus (hand-written first, then composed)."""
    hand_written = resources.files("voicesmith.resources").joinpath("demo_sentences.txt").read_text("utf-8")
    sentences = [line.strip() for line in hand_written.splitlines() if line.strip()][:n]
    rng = random.Random(20261121)  # fixed: a larger corpus extends a smaller one
    seen = set(sentences)
    while len(sentences) < n:
        sentence = _compose(rng)
        if sentence not in seen:
            seen.add(sentence)
            sentences.append(sentence)
    return sentences


def _compose(rng: random.Random) -> str:
    subject, verb, obj = rng.choice(_SUBJECTS), rng.choice(_VERBS), rng.choice(_OBJECTS)
    place, time = rng.choice(_PLACES), rng.choice(_TIMES)
    form = rng.randrange(4)
    if form == 0:
        return f"{subject.capitalize()} {verb} {obj} {place} {time}."
    if form == 1:
        return f"{time.capitalize()}, {subject} {verb} {obj} {place}."
    if form == 2:
        return f"Why did {subject} {_BASE_FORMS[verb]} {obj} {place}?"
    return f"{subject.capitalize()} {verb} {obj}, and then {rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} it {time}."


def write_demo_corpus(out_dir: Path, n: int = 100, speakers: int = 1) -> Path:
    """Write n utterances; one speaker: LJSpeech layout, several: VCTK layout (txt/<spk>, wav/<spk>)."""
    import soundfile as sf

    from voicesmith.errors import UserInputError
    from voicesmith.text.espeak import speak

    if n < 1:
        raise UserInputError(f"A demo corpus needs at least one utterance; --n was {n}.")
    if not 1 <= speakers <= len(SPEAKER_VOICES):
        raise UserInputError(f"--speakers must be between 1 and {len(SPEAKER_VOICES)}; it was {speakers}.")
    out_dir = Path(out_dir)
    rows = []
    for index, text in enumerate(demo_sentences(n)):
        speaker = index % speakers
        utterance_id = f"demo-{index + 1:04d}" if speakers == 1 else f"spk{speaker}_{index + 1:04d}"
        audio, sample_rate = speak(text, SPEAKER_VOICES[speaker], rate_wpm=150 + (index * 7) % 30)
        if sample_rate != SAMPLE_RATE:
            raise RuntimeError(f"espeak-ng spoke at {sample_rate} Hz; the demo corpus expects {SAMPLE_RATE} Hz")
        if speakers == 1:
            wav_path = out_dir / "wavs" / f"{utterance_id}.wav"
        else:
            wav_path = out_dir / "wav" / f"spk{speaker}" / f"{utterance_id}.wav"
            txt_path = out_dir / "txt" / f"spk{speaker}" / f"{utterance_id}.txt"
            txt_path.parent.mkdir(parents=True, exist_ok=True)
            txt_path.write_text(text + "\n", encoding="utf-8")
        wav_path.parent.mkdir(parents=True, exist_ok=True)
        sf.write(wav_path, _pad(audio), SAMPLE_RATE, subtype="PCM_16")
        rows.append(f"{utterance_id}|{text}|{text}")
    if speakers == 1:
        (out_dir / "metadata.csv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    return out_dir


def _pad(audio: np.ndarray) -> np.ndarray:
    """A little silence either side, as in a real recording session."""
    edge = np.zeros(SAMPLE_RATE // 20, dtype=np.int16)
    return np.concatenate([edge, audio.astype(np.int16), edge])
