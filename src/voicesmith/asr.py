"""Offline speech recognition for intelligibility scores: pocketsphinx's bundled US-English model.

The recogniser is a yardstick, not a product: what matters is that the synthesised audio and the
recording of the same text go through exactly the same steps, so the model's CER reads against the
CER the recogniser reaches on real speech. Both sides are conditioned alike before decoding:
mono, 16 kHz (the model's rate), scaled to -20 dBFS RMS, and given a fixed -55 dBFS Gaussian noise
floor. The floor matters: pocketsphinx's log filterbank misreads digital silence (exact zeros, as
espeak-ng and vocoders produce between words), and on the demo corpus it halves the CER of the
recordings (0.57 -> 0.28, benchmarks/RESULTS_eval.md). The feature state is reset before each
utterance, so a transcript does not depend on what was decoded before it.

Texts are compared after `normalize_for_asr` on both sides: the voice's own normalisation (numbers
and abbreviations written out), lower case, no punctuation or apostrophes, single spaces.
"""

from __future__ import annotations

import re
from functools import lru_cache
from importlib.metadata import version
from typing import Sequence, Union

import numpy as np

from voicesmith.audio import resample, to_mono
from voicesmith.errors import UserInputError
from voicesmith.text import normalize_text

ASR_SAMPLE_RATE = 16_000
ASR_LEVEL_DBFS = -20.0
NOISE_FLOOR_DBFS = -55.0
NOISE_SEED = 0
# Narrower search than the defaults (no second flat pass, at most 3000 active HMMs per frame): about
# 2.3x faster at the same CER on the demo corpus, which keeps evaluation during training affordable.
DECODER_OPTIONS = {"fwdflat": False, "maxhmmpf": 3000, "loglevel": "FATAL"}

_NOT_WORD_RE = re.compile(r"[^\w\s]|_|\d")
_SPACE_RE = re.compile(r"\s+")


def has_recognizer(language: str) -> bool:
    """pocketsphinx ships an English model only."""
    return language.lower().startswith("en")


def recognizer_name() -> str:
    return f"pocketsphinx {version('pocketsphinx')} (bundled en-us model)"


@lru_cache(maxsize=1)
def _decoder():
    """One decoder per process: loading the model takes about a second."""
    try:
        from pocketsphinx import Decoder
    except ImportError:
        raise UserInputError("Intelligibility scores need pocketsphinx, which is not installed; install it with "
                             "`pip install 'voicesmith[eval]'`.") from None
    return Decoder(**DECODER_OPTIONS)


def condition_for_asr(audio: np.ndarray, sample_rate: int) -> np.ndarray:
    """int16 samples at 16 kHz, levelled and with the fixed noise floor (see the module docstring)."""
    audio = resample(to_mono(audio), sample_rate, ASR_SAMPLE_RATE).astype(np.float64)
    rms = float(np.sqrt(np.mean(np.square(audio)))) if audio.size else 0.0
    if rms > 1e-6:  # digital silence stays silence
        audio *= 10 ** (ASR_LEVEL_DBFS / 20) / rms
    audio += np.random.default_rng(NOISE_SEED).normal(0.0, 10 ** (NOISE_FLOOR_DBFS / 20), audio.size)
    return (np.clip(audio, -1.0, 1.0) * 32767).astype(np.int16)


def transcribe(audio: np.ndarray, sample_rate: int) -> str:
    """What the recogniser hears in mono float audio; "" when it hears nothing."""
    samples = condition_for_asr(audio, sample_rate)
    if samples.size == 0:
        return ""
    decoder = _decoder()
    decoder.reinit_feat()  # forget the previous utterance's cepstral mean
    decoder.start_utt()
    decoder.process_raw(samples.tobytes(), no_search=False, full_utt=True)
    decoder.end_utt()
    hypothesis = decoder.hyp()
    return hypothesis.hypstr if hypothesis is not None else ""


def normalize_for_asr(text: str, language: str = "en-us") -> str:
    """The form both sides are scored in: written-out numbers, lower case, letters and spaces only."""
    text = normalize_text(text, language).lower().replace("'", "").replace("\u2019", "")
    return _SPACE_RE.sub(" ", _NOT_WORD_RE.sub(" ", text)).strip()


def error_rates(references: Union[str, Sequence[str]], hypotheses: Union[str, Sequence[str]],
                language: str = "en-us") -> tuple[float, float]:
    """(CER, WER) after `normalize_for_asr` on both sides; over several pairs, total edits / total length.

    An empty hypothesis scores 1.0 (everything deleted). An empty reference has no rate and is refused:
    leave such an item out of the scoring (and count it) before calling this.
    """
    import jiwer

    references = [references] if isinstance(references, str) else list(references)
    hypotheses = [hypotheses] if isinstance(hypotheses, str) else list(hypotheses)
    if len(references) != len(hypotheses):
        raise ValueError(f"{len(references)} references but {len(hypotheses)} hypotheses")
    references = [normalize_for_asr(text, language) for text in references]
    hypotheses = [normalize_for_asr(text, language) for text in hypotheses]
    if not references or not all(references):
        raise ValueError("every reference needs at least one word after normalisation")
    # jiwer counts an empty hypothesis as all deletions; scored explicitly so no version's rule decides
    pairs = [(ref, hyp) for ref, hyp in zip(references, hypotheses) if hyp]
    chars = sum(len(ref) for ref in references)
    words = sum(len(ref.split()) for ref in references)
    char_edits = sum(len(ref) for ref, hyp in zip(references, hypotheses) if not hyp)
    word_edits = sum(len(ref.split()) for ref, hyp in zip(references, hypotheses) if not hyp)
    if pairs:
        refs, hyps = [ref for ref, _ in pairs], [hyp for _, hyp in pairs]
        char_edits += _edits(jiwer.process_characters(refs, hyps))
        word_edits += _edits(jiwer.process_words(refs, hyps))
    return char_edits / chars, word_edits / words


def _edits(output) -> int:
    return output.substitutions + output.deletions + output.insertions
