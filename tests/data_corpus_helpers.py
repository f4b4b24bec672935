"""Small corpora with every defect validation must catch, built on the fly from demo speech."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import soundfile as sf
import soxr

from voicesmith.demo_corpus import write_demo_corpus

SAMPLE_RATE = 22050
LONG_TEXT = ("This transcript is far too long for the short recording it belongs to, and it keeps going with "
             "many more words than any speaker could say in half a second, so the alignment cannot fit it. ") * 2

# id -> (error kind that excludes it, or None when usable; warning kinds it must also get)
EXPECTED: dict[str, tuple[str | None, set[str]]] = {
    "good-1": (None, set()), "good-2": (None, set()), "good-3": (None, set()), "good-4": (None, set()),
    "stereo": (None, {"multichannel"}),
    "rate44k": (None, {"sample_rate"}),
    "clipped": (None, {"clipping"}),
    "quiet": (None, {"low_level"}),
    "padded": (None, {"long_silence"}),
    "silence": ("silence", set()),
    "nan": ("non_finite_audio", set()),
    "short": ("too_short", set()),
    "long": ("too_long", set()),
    "missing": ("missing_audio", set()),
    "empty": ("empty_file", set()),
    "noframes": ("empty_file", set()),
    "garbage": ("unreadable_audio", set()),
    "badutf8": ("not_utf8", set()),
    "line-20": ("unparseable_line", set()),
    "toomany": ("too_many_phonemes", set()),
    "notext": ("empty_text", set()),
    "dots": ("no_phonemes", set()),
}
DUPLICATE_LINE = 24  # a second "good-1" line: excluded, the first kept


def speech_clips(folder: Path, n: int) -> list[tuple[np.ndarray, str]]:
    """n espeak-ng utterances (float32 at 22050 Hz) and their texts."""
    corpus = write_demo_corpus(folder, n=n)
    rows = (corpus / "metadata.csv").read_text(encoding="utf-8").splitlines()
    clips = []
    for row in rows:
        item_id, _, text = row.split("|")
        audio, _ = sf.read(corpus / "wavs" / f"{item_id}.wav", dtype="float32")
        clips.append((audio, text))
    return clips


def make_broken_corpus(root: Path, scratch: Path) -> Path:
    """An LJSpeech folder holding EXPECTED's items in this order (line numbers matter)."""
    clips = speech_clips(scratch, 6)
    wavs = root / "wavs"
    wavs.mkdir(parents=True)
    lines: list[bytes] = []

    def item(item_id: str, text: str, audio: np.ndarray | None = None, rate: int = SAMPLE_RATE,
             subtype: str = "PCM_16") -> None:
        if audio is not None:
            sf.write(wavs / f"{item_id}.wav", audio, rate, subtype=subtype)
        lines.append(f"{item_id}|{text}|{text}".encode("utf-8"))

    speech, text = clips[0]
    for index in range(4):
        item(f"good-{index + 1}", clips[index][1], clips[index][0])
    item("stereo", clips[4][1], np.stack([clips[4][0], clips[4][0] * 0.5], axis=1))
    item("rate44k", clips[5][1], soxr.resample(clips[5][0], SAMPLE_RATE, 44100), rate=44100)
    item("clipped", text, np.clip(speech * 8, -1, 1))
    item("quiet", text, speech * 0.01)
    silence = np.zeros(int(1.6 * SAMPLE_RATE), dtype=np.float32)
    item("padded", text, np.concatenate([silence, speech, silence]))
    item("silence", text, np.zeros(2 * SAMPLE_RATE, dtype=np.float32))
    with_nan = speech.copy()
    with_nan[1000] = np.nan
    item("nan", text, with_nan, subtype="FLOAT")
    loud = np.flatnonzero(np.abs(speech) > 0.1)
    item("short", "Hi.", speech[loud[0]:loud[0] + int(0.3 * SAMPLE_RATE)])
    item("long", text, np.concatenate([clip for clip, _ in clips] * 2))
    item("missing", text)
    item("empty", text)
    (wavs / "empty.wav").write_bytes(b"")
    item("noframes", text, np.zeros(0, dtype=np.float32))
    item("garbage", text)
    (wavs / "garbage.wav").write_bytes(np.random.default_rng(0).integers(0, 255, 4000, dtype=np.uint8).tobytes())
    item("badutf8", text, speech)
    lines[-1] = "badutf8|caf".encode("utf-8") + b"\xe9 au lait"  # latin-1 in a UTF-8 file
    lines.append(b"  ")  # blank line 19: not an item
    lines.append(b"|no id here|")  # line 20: unparseable, id "line-20"
    item("toomany", LONG_TEXT, speech[loud[0]:loud[0] + int(0.6 * SAMPLE_RATE)])
    item("notext", " ", speech)
    item("dots", "...", speech)
    lines.append(f"good-1|{clips[1][1]}".encode("utf-8"))  # line 24: duplicate id
    (root / "metadata.csv").write_bytes(b"\n".join(lines) + b"\n")
    return root
