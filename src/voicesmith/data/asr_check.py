"""Recogniser check: what the offline recogniser hears in each clip, scored against its transcript.

A wrong transcript with a plausible length (another sentence of the corpus) passes every other check;
only listening tells it apart. `voicesmith.asr` (pocketsphinx's English model, the one `voicesmith
eval` uses) transcribes each usable item, and the character error rate against the transcript flags
items above `data.asr_max_cer`, as warnings or exclusions (`data.asr_check`). The recogniser is far
from perfect, so the threshold sits above its usual errors: on the espeak-ng demo corpus correct
transcripts score a median CER of 0.29 (90% below 0.48), transcripts of other clips 0.65 to 1.4
(median 0.77), hence the default of 0.6.

Decoding costs about a quarter of a second of CPU per second of audio, so it runs in worker
processes and its transcripts are cached per item (path, size, mtime, text) in a file whose name
holds the validation settings and the recogniser's own (version, search options, conditioning):
changing the threshold re-scores without decoding again.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
from dataclasses import dataclass
from typing import Callable, Optional

from voicesmith import asr
from voicesmith.config import AudioConfig, DataConfig, VoiceConfig
from voicesmith.data.conditioning import condition_audio
from voicesmith.data.formats import CorpusItem, Finding
from voicesmith.data.parallel import run_parallel
from voicesmith.data.report import ItemResult
from voicesmith.errors import DataError, UserInputError

CHECK = "asr"
KIND = "asr_mismatch"
PARALLEL_MIN_ITEMS = 16  # ~0.5 s of CPU per item vs ~2.5 s to start a worker


@dataclass(frozen=True)
class Listener:
    """Picklable settings for the worker processes: how a clip is conditioned before it is heard."""

    audio: AudioConfig
    data: DataConfig


def _hear(listener: Listener, item: CorpusItem) -> dict:
    """{"heard": text} or {"error": why}; never raises for bad audio."""
    try:
        conditioned = condition_audio(item.audio_path, listener.audio, listener.data)
    except (DataError, OSError, ValueError, RuntimeError) as exc:
        return {"error": f"{item.audio_path} could not be read for the recogniser ({exc}); validate again."}
    if conditioned.audio is None:
        return {"error": f"{item.audio_path} is silent or holds NaN/inf samples now; it changed since it was "
                         f"checked: validate again."}
    return {"heard": asr.transcribe(conditioned.audio, conditioned.sample_rate)}


def _hear_chunk(listener: Listener, items: list[CorpusItem]) -> list[dict]:
    return [_hear(listener, item) for item in items]


def _crashed(item: CorpusItem) -> dict:
    return {"error": "the process running the recogniser on this item died; run `voicesmith validate --asr` "
                     "again, and if it repeats look for a damaged audio file near this item."}


def recogniser_key() -> str:
    """A hash of everything that changes what the recogniser hears (not the threshold: scores are redone)."""
    settings = {"recogniser": asr.recognizer_name() if _installed() else "missing",
                "options": asr.DECODER_OPTIONS, "rate": asr.ASR_SAMPLE_RATE, "level": asr.ASR_LEVEL_DBFS,
                "noise": [asr.NOISE_FLOOR_DBFS, asr.NOISE_SEED]}
    return hashlib.sha1(json.dumps(settings, sort_keys=True).encode("utf-8")).hexdigest()[:12]


def _installed() -> bool:
    return importlib.util.find_spec("pocketsphinx") is not None and importlib.util.find_spec("jiwer") is not None


def check_transcripts(results: list[ItemResult], config: VoiceConfig, store, key_of: Callable[[CorpusItem], str],
                      workers: Optional[int] = None, progress: bool = False) -> dict:
    """Transcribe the usable items (cached in `store`, a ValidationCache keyed by `key_of(item)`), add a
    finding to each above the threshold, and return the check's record with the worst items."""
    language, data = config.text.language, config.data
    if not asr.has_recognizer(language):
        line = (f"Recogniser check skipped: no recogniser model for text.language={language!r} (English only "
                f"today).")
        return {"status": "unavailable", "reason": line, "summary": [line]}
    if not _installed():
        raise UserInputError("The recogniser check (--asr, data.asr_check) needs pocketsphinx and jiwer; install "
                             "them with `pip install 'voicesmith[eval]'`, or turn the check off.")
    targets = [result for result in results if not result.excluded and asr.normalize_for_asr(result.item.text, language)]
    keys = [key_of(result.item) for result in targets]
    todo = [(result.item, key) for result, key in zip(targets, keys) if key not in store.entries]
    heard = run_parallel(_hear_chunk, [item for item, _ in todo], Listener(config.audio, data), _crashed,
                         PARALLEL_MIN_ITEMS, workers, progress, "recognising")
    entries = {**store.entries, **{key: outcome for (_, key), outcome in zip(todo, heard)}}
    if todo and store.candidates:
        store.save({key: entries[key] for key in keys})
    scored = [_score(result, entries[key], data, language) for result, key in zip(targets, keys)]
    return _record(scored, data, len(todo))


def _score(result: ItemResult, outcome: dict, data: DataConfig, language: str) -> dict:
    if "error" in outcome:
        result.findings.append(Finding(result.id, result.line, "error", "check_failed", outcome["error"]))
        return {"id": result.id, "cer": None}
    cer, _ = asr.error_rates(result.item.text, outcome["heard"], language)
    if cer > data.asr_max_cer:
        severity = "error" if data.asr_check == "exclude" else "warning"
        result.findings.append(Finding(
            result.id, result.line, severity, KIND,
            f"the recogniser hears {outcome['heard']!r} (CER {cer:.2f} against the transcript, data.asr_max_cer "
            f"= {data.asr_max_cer:g}): the transcript may belong to another clip or miss words. Listen to the "
            f"clip and correct the text."))
    return {"id": result.id, "line": result.line, "cer": round(cer, 4), "text": result.item.text,
            "heard": outcome["heard"]}


def _record(scored: list[dict], data: DataConfig, decoded: int) -> dict:
    rated = sorted((row for row in scored if row["cer"] is not None), key=lambda row: -row["cer"])
    flagged = sum(row["cer"] > data.asr_max_cer for row in rated)
    mean = sum(row["cer"] for row in rated) / len(rated) if rated else None
    worst = rated[:data.asr_worst]
    action = "excluded" if data.asr_check == "exclude" else "warned"
    mean_text = "n/a" if mean is None else f"{mean:.3f}"
    lines = [f"Recogniser check ({asr.recognizer_name()}): {len(rated)} items, mean CER {mean_text}, "
             f"{flagged} {action} above {data.asr_max_cer:g} "
             f"({decoded} decoded now, {len(scored) - decoded} from the cache)."]
    if worst:
        lines.append(f"Highest recogniser CER (of {len(rated)}):")
        lines += [f"  {row['id']}: CER {row['cer']:.2f}\n      text:  {row['text']}\n      heard: {row['heard']}"
                  for row in worst]
    failed = len(scored) - len(rated)
    if failed:
        lines.append(f"  {failed} item(s) could not be heard (check_failed in the report).")
    return {"status": "done", "recogniser": asr.recognizer_name(), "items": len(rated), "mean_cer": mean,
            "flagged": flagged, "action": action, "threshold": data.asr_max_cer, "decoded": decoded,
            "worst": worst, "summary": lines}
