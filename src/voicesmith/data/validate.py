"""Validation: every item of a corpus checked, one finding per problem, nothing dropped silently.

Errors exclude an item, warnings keep it (the cache fixes it up: resampled, downmixed, trimmed,
level-normalised). Checks run in spawned worker processes for large corpora and are cached per
item, keyed by the audio file's path, size and mtime, the text and every setting that changes a
verdict, so a second run only stats the files. The cache is a JSON file in
`<dataset>/.voicesmith-cache/` (for a filelist: next to it); when that folder cannot be written
it goes to the user cache folder (`$XDG_CACHE_HOME/voicesmith/validation/`), and when neither
can, validation runs uncached.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import re
import string
import sys
import unicodedata
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Callable, Optional, Sequence, Union

import soundfile as sf

from voicesmith.audio import stft_padding
from voicesmith.config import DataConfig, VoiceConfig, load_config
from voicesmith.data import asr_check, speaking_rate
from voicesmith.data.conditioning import condition_audio
from voicesmith.data.formats import Corpus, CorpusItem, Finding, read_corpus
from voicesmith.data.parallel import run_parallel
from voicesmith.data.report import ItemResult, ValidationReport
from voicesmith.errors import DataError, DiskFull
from voicesmith.fileio import write_text
from voicesmith.text import EncodedText, SymbolTable, TextFrontend, build_symbol_table

log = logging.getLogger(__name__)

CACHE_VERSION = 2
CACHE_FOLDER = ".voicesmith-cache"
PARALLEL_MIN_ITEMS = 4000  # ~1.6 ms of CPU per item vs ~2.5 s to start a worker: processes pay off from here

CacheSetting = Union[bool, Path]
_BRACKETED_RE = re.compile(r"\[[^\]]*\]|<[^>]*>|\{[^}]*\}")  # [inaudible], <unk>, {noise}: tags, not speech
PLACEHOLDER_WORDS = frozenset({"todo", "tbd", "xxx", "n/a", "placeholder", "untranscribed", "null"})


HEADER_LENGTH_FACTOR = 3  # a header declaring more than this x data.max_seconds is refused undecoded
# (trimming long silences can bring a somewhat longer clip under the limit; nothing brings 3x under it)


# --- one item ----------------------------------------------------------------------------

@dataclass
class ItemChecker:
    """Everything a worker needs to judge items; picklable, built once per process."""

    config: VoiceConfig
    frontend: TextFrontend

    def check_many(self, items: list[CorpusItem]) -> list[ItemResult]:
        """Check items; their texts go to espeak-ng in one call (far faster than one by one)."""
        return [self.check(item, encoded) for item, encoded in zip(items, self._encode_all(items))]

    def _encode_all(self, items: list[CorpusItem]) -> list[Union[EncodedText, Exception]]:
        try:
            return self.frontend.encode_batch([item.text for item in items])
        except Exception:  # one text broke the batch: encode one by one, so only that item fails
            return [self._encode_one(item.text) for item in items]

    def _encode_one(self, text: str) -> Union[EncodedText, Exception]:
        try:
            return self.frontend.encode(text)
        except Exception as exc:  # reported by `check` as that item's check_failed finding
            return exc

    def check(self, item: CorpusItem, encoded: Union[EncodedText, Exception, None] = None) -> ItemResult:
        result = ItemResult(item.id, item.line, item=item)
        try:
            self._check_text(item, result, self._encode_one(item.text) if encoded is None else encoded)
            self._check_audio(item, result)
        except Exception as exc:  # a bug or an exotic file must not stop the other 9,999 items
            log.debug("check of %s failed", item.id, exc_info=True)
            self._add(result, "error", "check_failed",
                      f"checking this item failed ({type(exc).__name__}: {exc}); look at {item.audio_path} "
                      f"and its text, and report a bug if they look fine.")
        if result.ids and result.n_frames and len(result.ids) > result.n_frames:
            self._add(result, "error", "too_many_phonemes",
                      f"{len(result.ids)} phoneme ids (pads included) but only {result.n_frames} mel frames "
                      f"({result.seconds:.2f} s after trimming): the alignment needs a frame per id. The "
                      f"transcript is probably too long for this clip; check that text and audio match.")
        elif len(result.ids) > self.config.model.max_phonemes:
            self._add(result, "error", "over_phoneme_cap",
                      f"{len(result.ids)} phoneme ids (pads included); the cap is model.max_phonemes = "
                      f"{self.config.model.max_phonemes}, so that one long item cannot run the GPU out of memory. "
                      f"Split the clip and its text, or raise the cap.")
        return result

    @staticmethod
    def _add(result: ItemResult, severity: str, kind: str, message: str) -> None:
        result.findings.append(Finding(result.id, result.line, severity, kind, message))

    def _check_text(self, item: CorpusItem, result: ItemResult, encoded: Union[EncodedText, Exception]) -> None:
        if not item.text.strip():
            self._add(result, "error", "empty_text", "the transcript is empty; write what is said in the clip.")
            return
        if isinstance(encoded, Exception):
            raise encoded
        if encoded.unknown:
            symbols = " ".join(sorted(set(encoded.unknown)))
            self._add(result, "warning", "unknown_symbols",
                      f"symbols not in the symbol table are left out: {symbols}. Rewrite them in words, or "
                      f"check text.language.")
        if not _has_phoneme(encoded.phonemes):
            self._add(result, "error", "no_phonemes",
                      f"the text {item.text!r} yields no phonemes; write it out in words.")
            return
        if not has_words(item.text):
            self._add(result, "error", "no_words",
                      f"the transcript {item.text!r} has no letter or digit outside placeholders and tags, so it "
                      f"says nothing of the audio; write what is said in the clip.")
            return
        result.ids = list(encoded.ids)
        result.n_phonemes = _phoneme_count(encoded.phonemes)

    def _check_audio(self, item: CorpusItem, result: ItemResult) -> None:
        data, audio = self.config.data, self.config.audio
        path = item.audio_path
        if not path.is_file():
            self._add(result, "error", "missing_audio",
                      f"{path} does not exist; add the recording or remove the line.")
            return
        if path.stat().st_size == 0:
            self._add(result, "error", "empty_file", f"{path} is an empty file (0 bytes); re-export the recording.")
            return
        try:
            info = sf.info(str(path))
        except (sf.LibsndfileError, RuntimeError, OSError) as exc:
            self._add(result, "error", "unreadable_audio",
                      f"{path} cannot be decoded ({exc}); re-export it as WAV or FLAC.")
            return
        if info.frames == 0:
            self._add(result, "error", "empty_file", f"{path} holds no samples; re-record or remove this item.")
            return
        declared = info.frames / max(info.samplerate, 1)
        if declared > HEADER_LENGTH_FACTOR * data.max_seconds:  # refused from the header, before decoding
            self._add(result, "error", "too_long",
                      f"its header declares {declared:.0f} s of audio, far above data.max_seconds = "
                      f"{data.max_seconds:g} s; it was not decoded. Split the recording (and its text).")
            return
        try:
            conditioned = condition_audio(path, audio, data)
        except DataError as exc:
            self._add(result, "error", "unreadable_audio", str(exc))
            return
        facts = conditioned.facts
        if not facts.finite:
            self._add(result, "error", "non_finite_audio",
                      f"{path} holds NaN or infinite samples; re-export it from the original recording.")
            return
        if facts.sample_rate != audio.sample_rate:
            self._add(result, "warning", "sample_rate",
                      f"recorded at {facts.sample_rate} Hz; resampled to {audio.sample_rate} Hz when loaded "
                      f"(resample the files once to save that work on every preparation).")
        if facts.channels > 1:
            self._add(result, "warning", "multichannel",
                      f"{facts.channels} channels; downmixed to mono when loaded.")
        if conditioned.audio is None:
            level = "every sample is zero" if facts.peak_dbfs == -math.inf else f"peak {facts.peak_dbfs:.0f} dBFS"
            self._add(result, "error", "silence",
                      f"the clip is silent ({level}; data.silence_dbfs = {data.silence_dbfs:g}); replace the "
                      f"recording.")
            return
        self._check_level(facts, data, result)
        result.seconds = conditioned.seconds
        kept_silence = 0.0 if data.trim_silence else facts.leading_silence + facts.trailing_silence
        result.speech_seconds = max(0.0, conditioned.seconds - kept_silence)
        result.n_frames = len(conditioned.audio) // audio.hop_length
        self._check_duration(result, data, audio.hop_length, max(stft_padding(audio)))

    def _check_level(self, facts, data: DataConfig, result: ItemResult) -> None:
        edges = max(facts.leading_silence, facts.trailing_silence)
        if edges > data.long_silence_seconds:
            fix = ("trimmed when loaded" if data.trim_silence
                   else "kept because data.trim_silence is off: cut it or turn trimming on")
            self._add(result, "warning", "long_silence",
                      f"{facts.leading_silence:.1f} s of silence at the start and {facts.trailing_silence:.1f} s "
                      f"at the end; {fix}.")
        if facts.peak_dbfs < data.low_level_dbfs:
            fix = ("scaled up when loaded, noise with it" if data.normalize_peak
                   else "kept as is because data.normalize_peak is off")
            self._add(result, "warning", "low_level",
                      f"very quiet: peak {facts.peak_dbfs:.0f} dBFS ({fix}); record louder, peaks around "
                      f"-6 to -3 dBFS.")
        if facts.clipped_fraction > data.clipping_fraction:
            self._add(result, "warning", "clipping",
                      f"{100 * facts.clipped_fraction:.2f}% of the samples are at full scale (clipped); the voice "
                      f"learns the distortion. Re-record at a lower gain or remove the item.")

    def _check_duration(self, result: ItemResult, data: DataConfig, hop: int, stft_edge: int) -> None:
        trimmed = " after trimming silence" if data.trim_silence else ""
        if result.seconds < data.min_seconds or result.n_frames * hop <= stft_edge:
            self._add(result, "error", "too_short",
                      f"{result.seconds:.2f} s of audio{trimmed}; the minimum is data.min_seconds = "
                      f"{data.min_seconds:g} s.")
        elif result.seconds > data.max_seconds:
            self._add(result, "error", "too_long",
                      f"{result.seconds:.2f} s of audio{trimmed}; the maximum is data.max_seconds = "
                      f"{data.max_seconds:g} s. Split the clip (and its text) or raise the maximum.")


def _has_phoneme(phonemes: str) -> bool:
    """Anything besides spaces and punctuation (which alone give the model nothing to say)."""
    return any(not ch.isspace() and not unicodedata.category(ch).startswith("P") for ch in phonemes)


def _phoneme_count(phonemes: str) -> int:
    """Sounds said: letters of the phoneme string, not stress or length marks (Lm), spaces or punctuation."""
    return sum(unicodedata.category(ch) in ("Ll", "Lu", "Lo", "Lt") for ch in phonemes)


def has_words(text: str) -> bool:
    """A letter or digit outside bracketed tags and placeholder words ("TODO", "n/a", "xxx"): something is said.

    espeak-ng reads symbols aloud ("#" is "hash"), so phonemes alone do not prove the text is a transcript.
    """
    words = _BRACKETED_RE.sub(" ", text).split()
    spoken = [word for word in words if word.strip(string.punctuation).lower() not in PLACEHOLDER_WORDS]
    return any(unicodedata.category(ch)[0] in "LN" for word in spoken for ch in word)


# --- many items, in parallel ---------------------------------------------------------------

def _check_chunk(checker: ItemChecker, items: list[CorpusItem]) -> list[dict]:
    return [_result_to_cache(result) for result in checker.check_many(items)]


def _crashed(item: CorpusItem) -> dict:
    """A worker died (e.g. a decoder crashed on a damaged file): every item of its chunk is reported."""
    return {"findings": [["error", "check_failed",
                          "the process checking this item died; run `voicesmith validate` again, and if it "
                          "repeats look for a damaged audio file near this item."]]}


# --- the validation cache ---------------------------------------------------------------------

def _result_to_cache(result: ItemResult) -> dict:
    """What a verdict holds besides id and line (those follow the metadata, not the file)."""
    return {"findings": [[f.severity, f.kind, f.message] for f in result.findings],
            "seconds": result.seconds, "n_frames": result.n_frames, "ids": result.ids,
            "n_phonemes": result.n_phonemes, "speech_seconds": result.speech_seconds}


def _result_from_cache(item: CorpusItem, data: dict) -> ItemResult:
    findings = [Finding(item.id, item.line, severity, kind, message) for severity, kind, message in data["findings"]]
    return ItemResult(item.id, item.line, findings, item, data.get("seconds", 0.0), data.get("n_frames", 0),
                      list(data.get("ids", [])), data.get("n_phonemes", 0), data.get("speech_seconds", 0.0))


def settings_key(config: VoiceConfig, table: SymbolTable) -> str:
    """A hash of every setting that can change a verdict."""
    data = config.data.model_dump(mode="json", include={
        "min_seconds", "max_seconds", "trim_silence", "trim_top_db", "long_silence_seconds", "silence_dbfs",
        "low_level_dbfs", "clipping_fraction", "normalize_peak"})
    blob = json.dumps({"version": [CACHE_VERSION, _package_version()], "data": data, "audio": config.audio.model_dump(mode="json"),
                       "text": config.text.model_dump(mode="json"), "symbols": table.to_dict(),
                       "max_phonemes": config.model.max_phonemes}, sort_keys=True)
    return hashlib.sha1(blob.encode("utf-8")).hexdigest()[:16]


def _package_version() -> str:
    """Part of the key, so verdicts and messages made by an older voicesmith are not reused."""
    try:
        return metadata.version("voicesmith")
    except metadata.PackageNotFoundError:  # running from a source tree that is not installed
        return "unknown"


def _item_key(item: CorpusItem) -> str:
    """Path, size and mtime of the audio, and the text: a changed file or line is checked again."""
    try:
        stat = item.audio_path.stat()
        signature = f"{stat.st_size}:{stat.st_mtime_ns}"
    except OSError:
        signature = "missing"
    text = hashlib.sha1(item.text.encode("utf-8")).hexdigest()[:16]
    return f"{item.audio_path}|{signature}|{text}"


class ValidationCache:
    """Verdicts keyed by `_item_key`, in one JSON file per settings key."""

    def __init__(self, candidates: list[Path]):
        self.candidates = candidates
        self.entries: dict[str, dict] = {}
        for path in candidates:
            if path.is_file():
                try:
                    self.entries = json.loads(path.read_text(encoding="utf-8"))["entries"]
                    break
                except (OSError, ValueError, KeyError, TypeError) as exc:
                    log.warning("ignoring the unreadable validation cache %s (%s)", path, exc)

    def save(self, entries: dict[str, dict]) -> Optional[Path]:
        blob = json.dumps({"version": CACHE_VERSION, "entries": entries}, ensure_ascii=False)
        for path in self.candidates:
            try:
                return write_text(path, blob, durable=False)  # a speed-up only: rebuilt when lost
            except (OSError, DiskFull) as exc:
                log.info("cannot write the validation cache %s (%s)", path, exc)
        log.warning("validation cache not written (no writable place); the next run checks every item again")
        return None


def cache_candidates(corpus: Corpus, key: str, cache: CacheSetting) -> list[Path]:
    name = f"validation-{key}.json"
    if cache is False:
        return []
    if cache is not True:
        return [Path(cache) / name]
    root_hash = hashlib.sha1(str(corpus.source.resolve()).encode("utf-8")).hexdigest()[:12]
    return [corpus.root / CACHE_FOLDER / name, user_cache_dir() / "validation" / f"{root_hash}-{name}"]


def user_cache_dir() -> Path:
    if sys.platform == "win32":
        return Path(os.environ.get("LOCALAPPDATA", Path.home() / "AppData" / "Local")) / "voicesmith"
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "voicesmith"


# --- the whole corpus ----------------------------------------------------------------------------

def default_symbols(config: VoiceConfig, corpus: Corpus) -> SymbolTable:
    """Piper's table for espeak phonemes; for characters, the characters of this corpus."""
    return build_symbol_table(config.text, [item.text for item in corpus.items])


def validate_corpus(dataset: Path, config: VoiceConfig, format: str = "auto", workers: Optional[int] = None,
                    symbols: Optional[SymbolTable] = None, cache: CacheSetting = True,
                    progress: bool = False) -> ValidationReport:
    """Check every item of a dataset; items_total = items_usable + items excluded, always."""
    corpus = read_corpus(Path(dataset), format)
    table = symbols if symbols is not None else default_symbols(config, corpus)
    settings = settings_key(config, table)
    store = ValidationCache(cache_candidates(corpus, settings, cache))
    keys = [_item_key(item) for item in corpus.items]
    todo = [(item, key) for item, key in zip(corpus.items, keys) if key not in store.entries]
    checker = ItemChecker(config, TextFrontend(config.text, table))
    checked = run_parallel(_check_chunk, [item for item, _ in todo], checker, _crashed, PARALLEL_MIN_ITEMS,
                           workers, progress, "validating")
    verdicts = {**store.entries, **{key: verdict for (_, key), verdict in zip(todo, checked)}}
    if todo and store.candidates:
        store.save({key: verdicts[key] for key in keys})
    results = [_result_from_cache(item, verdicts[key]) for item, key in zip(corpus.items, keys)]
    results += [ItemResult(finding.id, finding.line, [finding]) for finding in corpus.findings]
    results.sort(key=lambda result: result.line if result.line is not None else 0)
    checks = {speaking_rate.CHECK: speaking_rate.check_speaking_rate(results, config.data)}
    if config.data.asr_check != "off":
        store = ValidationCache(cache_candidates(corpus, f"{settings}-asr-{asr_check.recogniser_key()}", cache))
        checks[asr_check.CHECK] = asr_check.check_transcripts(results, config, store, _item_key, workers, progress)
    return ValidationReport(dataset=Path(dataset), format=corpus.format, results=results,
                            unlisted_audio=corpus.unlisted_audio, settings_key=settings, checks=checks)


def validate_command(dataset: Path, report_path: Optional[Path] = None, format: str = "auto",
                     config_path: Optional[Path] = None, asr: bool = False,
                     extra_checks: Sequence[tuple[str, Callable[[ValidationReport], dict]]] = ()) -> int:
    """`voicesmith validate`: print the summary, write the report, exit 0 (usable items) or 2 (none).

    The limits (durations, levels, audio and text settings) come from `config_path` when given,
    else from the defaults. `asr` runs the recogniser check (warning, unless data.asr_check says
    exclude). `extra_checks` are (name, check) pairs run on the finished report, whose records join
    it (the CLI passes the model check here, so this module needs no model).
    """
    config = load_config(config_path) if config_path else VoiceConfig(data=DataConfig(dataset=str(dataset)))
    if asr and config.data.asr_check == "off":
        config.data.asr_check = "warn"
    progress = sys.stderr.isatty()
    report = validate_corpus(Path(dataset), config, format=format, progress=progress)
    for name, check in extra_checks:
        report.checks[name] = check(report)
    print(report.summary())
    if report_path is not None:
        print(f"Report written to {report.save(Path(report_path))}")
    if report.items_usable == 0:
        print("No usable item. Most common reasons:", file=sys.stderr)
        for reason in report.top_reasons():
            print(f"  - {reason}", file=sys.stderr)
        return 2
    return 0
