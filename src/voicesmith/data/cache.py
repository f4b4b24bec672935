"""The feature cache: what training reads, built once and rebuilt only where something changed.

Layout of `config.data.cache_dir`:
```
manifest.json        per usable item: id, speaker, text, phoneme ids, n_frames, feature file (with its size
                     and CRC-32), source stat
symbols.json         the SymbolTable (kept once written, so ids stay stable for checkpoints)
speakers.json        {speaker name: id}, names sorted; {} for a single-speaker corpus
data_report.json     the validation report, preparation failures included
features/<audio key>/<id>-<source hash>.pt
                     torch.save({"mel": float32 [n_mels, n_frames], "audio": int16 [n_frames * hop]})
```
The audio key hashes every setting that changes mels or waveforms (audio section, trimming, level);
the file name hashes the item id, source path, size and mtime. So a changed recording rebuilds one
file, a changed text re-phonemizes one line (phoneme ids live in the manifest, not in the features)
and a changed audio setting rebuilds the features but not the phonemes. Every file is written to a
temporary name and renamed, so an interrupted run never leaves half a file behind. The waveform is
level-normalised (data.normalize_peak), quantised to int16, and the mel is computed from exactly that
quantised waveform, cut to `n_frames * hop` samples: audio and mel line up sample for sample.

A feature file is checked before the model sees it: `prepare` rebuilds one whose size differs from
the manifest's (a cut-off write), and the Dataset checks the CRC-32 of the bytes it reads and rebuilds
a damaged file in place from its recording (features are computed on one thread, so the rebuilt bytes
are the same). A full disk stops preparation with what to free; it never excludes items.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import re
import shutil
import sys
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np
import torch

from voicesmith.audio import mel_spectrogram
from voicesmith.config import AudioConfig, DataConfig, VoiceConfig, load_config
from voicesmith.data.conditioning import condition_audio, normalize_level
from voicesmith.data.formats import CorpusItem, Finding, read_corpus
from voicesmith.data.loader import INT16_SCALE
from voicesmith.data.parallel import run_parallel, single_thread
from voicesmith.data.report import ValidationReport
from voicesmith.data.validate import default_symbols, settings_key, validate_corpus
from voicesmith.errors import DataError, UserInputError
from voicesmith.fileio import atomic_write, atomic_write_json
from voicesmith.text import SymbolTable

log = logging.getLogger(__name__)

FORMAT_VERSION = 2  # 2: feature files carry their size and CRC-32 in the manifest
MANIFEST, SYMBOLS, SPEAKERS, REPORT, FEATURES = "manifest.json", "symbols.json", "speakers.json", \
    "data_report.json", "features"
PARALLEL_MIN_ITEMS = 1000  # ~5 ms of CPU per item vs ~2.5 s to start a worker: processes pay off from here


@dataclass
class FeatureCache:
    """A prepared cache: the manifest entries of the usable items plus symbols and speakers."""

    root: Path
    entries: list[dict]
    symbols: SymbolTable
    speakers: dict[str, int]
    audio_key: str
    report: Optional[ValidationReport] = None
    stats: dict = field(default_factory=dict)  # built / reused / failed in the last `prepare`

    @classmethod
    def load(cls, root: Path) -> "FeatureCache":
        """Open a cache prepared earlier (no checks against the dataset: `prepare` does those)."""
        root = Path(root)
        manifest = _read_json(root / MANIFEST)
        if manifest is None or manifest.get("version") != FORMAT_VERSION:
            raise DataError(f"{root} holds no feature cache of this voicesmith version; "
                            f"run `voicesmith prepare CONFIG` first.")
        return cls(root, manifest["items"], SymbolTable.load(root / SYMBOLS), read_speakers(root / SPEAKERS),
                   manifest["audio_key"])

    @property
    def n_speakers(self) -> int:
        return max(1, len(self.speakers))

    @property
    def lengths(self) -> list[int]:
        """Mel frames per item (what the batch sampler buckets by)."""
        return [entry["n_frames"] for entry in self.entries]

    def __len__(self) -> int:
        return len(self.entries)


# --- one item ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class FeatureBuilder:
    """Picklable settings for the worker processes."""

    audio: AudioConfig
    data: DataConfig


def build_features(builder: FeatureBuilder, job: tuple[str, str]) -> dict:
    """Write one item's features; returns {"n_frames", "bytes", "crc32"} or {"error": why}.

    Never raises for bad data; a full disk raises DiskFull, which stops preparation (no item is
    excluded for want of space).
    """
    source, target = Path(job[0]), Path(job[1])
    try:
        conditioned = condition_audio(source, builder.audio, builder.data)
        if conditioned.audio is None:
            return {"error": f"{source} is silent or holds NaN/inf samples now; it passed validation, so it "
                             f"changed since: validate again."}
        hop = builder.audio.hop_length
        n_frames = len(conditioned.audio) // hop
        audio = normalize_level(conditioned.audio[:n_frames * hop], builder.data.normalize_peak)
        quantised = torch.from_numpy(np.round(np.clip(audio, -1, 1) * INT16_SCALE).astype(np.int16))
        mel = mel_spectrogram(quantised.float() / INT16_SCALE, builder.audio)
        blob = io.BytesIO()
        torch.save({"mel": mel.contiguous(), "audio": quantised}, blob)
        data = blob.getvalue()
        atomic_write(target, lambda handle: handle.write(data), durable=False, to_free=_cache_advice(target))
    except (DataError, OSError, ValueError, RuntimeError) as exc:
        return {"error": f"preparing {source} failed ({type(exc).__name__}: {exc}); validate again and check "
                         f"the file."}
    return {"n_frames": n_frames, "bytes": len(data), "crc32": zlib.crc32(data)}


def _cache_advice(target: Path) -> str:
    cache_root = target.parent.parent.parent  # <cache>/features/<audio key>/<file>
    return (f"delete runs or caches you no longer need, or set data.cache_dir to a folder on a larger disk "
            f"(this feature cache is {cache_root}; what it already holds is kept)")


def rebuild_features(builder: FeatureBuilder, root: Path, entry: dict) -> bytes:
    """Build one item's damaged feature file again from its recording; its bytes, checked against the
    manifest. DataError (naming the item) when they still differ: the recording changed since."""
    target = root / entry["file"]
    with single_thread():  # the thread count must match preparation's for the same bytes
        outcome = build_features(builder, (entry["source"]["path"], str(target)))
    data = target.read_bytes() if "error" not in outcome else b""
    if zlib.crc32(data) != entry["crc32"]:
        raise DataError(f"The cached features of item {entry['id']} ({target}) were damaged and rebuilding them "
                        f"from {entry['source']['path']} gave other features "
                        f"({outcome.get('error', 'the recording or the settings changed since preparation')}); "
                        f"run `voicesmith prepare CONFIG` again.")
    log.warning("The cached features of item %s (%s) were damaged (checksum mismatch); rebuilt from %s.",
                entry["id"], target, entry["source"]["path"])
    return data


def build_chunk(builder: FeatureBuilder, jobs: list[tuple[str, str]]) -> list[dict]:
    return [build_features(builder, job) for job in jobs]


def _crashed(job: tuple[str, str]) -> dict:
    return {"error": f"the process preparing {job[0]} died; run prepare again, and if it repeats look for a "
                     f"damaged audio file."}


def audio_key(config: VoiceConfig) -> str:
    """Hash of every setting that changes a mel or a cached waveform."""
    settings = {"version": FORMAT_VERSION, "audio": config.audio.model_dump(mode="json"),
                "data": config.data.model_dump(mode="json", include={"trim_silence", "trim_top_db", "normalize_peak"})}
    return hashlib.sha1(json.dumps(settings, sort_keys=True).encode("utf-8")).hexdigest()[:12]


def prepare(config: VoiceConfig, report: Optional[ValidationReport] = None, progress: bool = True,
            workers: Optional[int] = None) -> FeatureCache:
    """Validate (cached) and build the missing features; raises DataError when no item is usable.

    Writes the report to the cache and, for a config loaded from a file, to RUN_DIR/data_report.json.
    """
    root = config.resolve(config.data.cache_dir)
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserInputError(f"Cannot create the feature cache folder {root} ({exc.strerror}); set data.cache_dir "
                             f"to a writable folder.") from None
    dataset = config.resolve(config.data.dataset)
    symbols = _symbol_table(root, config, dataset)
    if report is None or report.settings_key != settings_key(config, symbols):
        report = validate_corpus(dataset, config, config.data.format, workers, symbols, progress=progress)
    speakers = _speaker_map(root, [item.speaker for item in report.usable_items])
    key = audio_key(config)
    entries, jobs = _plan(root, report, speakers, key)
    outcomes = run_parallel(build_chunk, [(entry["source"]["path"], str(root / entry["file"])) for entry in jobs],
                            FeatureBuilder(config.audio, config.data), _crashed, PARALLEL_MIN_ITEMS, workers, progress,
                            "preparing")
    failed = _apply_outcomes(jobs, outcomes, report)
    entries = [entry for entry in entries if entry["id"] not in failed]
    _write_cache(root, config, key, entries, speakers, report)
    built = len(jobs) - len(failed)
    cache = FeatureCache(root, entries, symbols, speakers, key, report,
                         {"built": built, "reused": len(entries) - built, "failed": len(failed)})
    if not entries:
        reasons = "\n".join(f"  - {reason}" for reason in report.top_reasons())
        raise DataError(f"No usable item in {dataset} ({report.items_total} items, all excluded). Most common "
                        f"reasons:\n{reasons}\nThe full list is in {root / REPORT}.")
    return cache


def _plan(root: Path, report: ValidationReport, speakers: dict[str, int], key: str) -> tuple[list[dict], list[dict]]:
    """Manifest entries of the usable items, and those of them whose features must be built."""
    manifest = _read_json(root / MANIFEST) or {}
    previous = {entry["file"]: entry for entry in manifest.get("items", [])} \
        if manifest.get("version") == FORMAT_VERSION else {}
    entries, jobs = [], []
    for result in report.usable:
        entry = _entry(result.item, result.ids, result.n_frames, speakers, key)
        if entry is None:
            report.exclude(result.id, Finding(result.id, result.line, "error", "prepare_failed",
                                              f"{result.item.audio_path} vanished after validation; restore it."))
            continue
        entries.append(entry)
        built = previous.get(entry["file"])
        if built is not None and _file_size(root / entry["file"]) == built["bytes"]:
            entry.update(n_frames=built["n_frames"], bytes=built["bytes"], crc32=built["crc32"])
        else:
            jobs.append(entry)  # new, changed, missing or cut off: built (again)
    return entries, jobs


def _file_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return -1


def _entry(item: CorpusItem, ids: list[int], n_frames: int, speakers: dict[str, int], key: str) -> Optional[dict]:
    try:
        stat = item.audio_path.stat()
    except OSError:
        return None
    source = {"path": str(item.audio_path), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
    digest = hashlib.sha1(json.dumps([item.id, source], sort_keys=True).encode("utf-8")).hexdigest()[:12]
    safe_id = re.sub(r"[^A-Za-z0-9._-]+", "_", item.id)[:80]
    return {"id": item.id, "line": item.line, "speaker": item.speaker, "speaker_id": speakers.get(item.speaker, 0),
            "text": item.text, "ids": ids, "n_ids": len(ids), "n_frames": n_frames,
            "file": f"{FEATURES}/{key}/{safe_id}-{digest}.pt", "source": source}


def _apply_outcomes(jobs: list[dict], outcomes: list[dict], report: ValidationReport) -> set[str]:
    """Record built lengths; exclude (and report) every item that failed or no longer fits its text."""
    failed = set()
    for entry, outcome in zip(jobs, outcomes):
        message = outcome.get("error")
        if message is None:
            entry.update(n_frames=outcome["n_frames"], bytes=outcome["bytes"], crc32=outcome["crc32"])
            if entry["n_ids"] > entry["n_frames"]:
                message = (f"{entry['n_ids']} phoneme ids but only {entry['n_frames']} mel frames after "
                           f"preparation; the audio changed since validation: validate again.")
        if message is not None:
            failed.add(entry["id"])
            report.exclude(entry["id"], Finding(entry["id"], entry["line"], "error", "prepare_failed", message))
    return failed


def _symbol_table(root: Path, config: VoiceConfig, dataset: Path) -> SymbolTable:
    """The cache's table when it has one for this phonemizer (ids must not shift under a trained model)."""
    path = root / SYMBOLS
    if path.is_file():
        table = SymbolTable.load(path)
        if table.kind == config.text.phonemizer:
            return table
        log.warning("%s was made for text.phonemizer=%s; making a new table for %s", path, table.kind,
                    config.text.phonemizer)
    table = default_symbols(config, read_corpus(dataset, config.data.format))
    table.save(path)
    return table


def _speaker_map(root: Path, names: list[str]) -> dict[str, int]:
    """Sorted names -> ids; speakers already in the cache keep their ids, new ones are appended."""
    known = read_speakers(root / SPEAKERS)
    new = sorted(set(names) - set(known))
    if not known and new in ([], [""]):
        return {}
    return {**known, **{name: len(known) + index for index, name in enumerate(new)}}


def _write_cache(root: Path, config: VoiceConfig, key: str, entries: list[dict], speakers: dict[str, int],
                 report: ValidationReport) -> None:
    manifest = {"version": FORMAT_VERSION, "audio_key": key, "dataset": str(report.dataset),
                "audio": config.audio.model_dump(mode="json"), "text": config.text.model_dump(mode="json"),
                "items_total": report.items_total,
                "items": entries}
    atomic_write_json(root / MANIFEST, manifest)
    atomic_write_json(root / SPEAKERS, speakers)
    report.save(root / REPORT)
    if config.path is not None:
        report.save(config.run_dir / REPORT)
    _prune(root / FEATURES, key, {Path(entry["file"]).name for entry in entries})


def _prune(features: Path, key: str, keep: set[str]) -> None:
    """Remove features of other settings and of items no longer in the corpus (and stray temp files)."""
    if not features.is_dir():
        return
    for folder in features.iterdir():
        if folder.name != key:
            shutil.rmtree(folder, ignore_errors=True)
            continue
        for path in folder.iterdir():
            if path.name not in keep:
                path.unlink(missing_ok=True)


def read_speakers(path: Path) -> dict[str, int]:
    """{speaker name: id} from speakers.json; {} when there is none. A damaged file is an error, never
    silently rebuilt: a trained model's speaker ids depend on it, and new ids would swap voices."""
    try:
        speakers = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        speakers = exc
    valid = isinstance(speakers, dict) and all(isinstance(k, str) and type(v) is int for k, v in speakers.items()) \
        and sorted(speakers.values()) == list(range(len(speakers)))
    if not valid:
        problem = f"cannot be read ({speakers})" if isinstance(speakers, Exception) else \
            "is not a map of speaker names to the ids 0..N-1"
        raise DataError(f"The speaker map {path} {problem}. A trained model's speaker ids depend on it: restore it "
                        f"from a backup or from a checkpoint of this run (its voicesmith block holds `speakers`), or "
                        f"delete it to number the speakers afresh and start a new run with `--resume never`.")
    return speakers


def _read_json(path: Path):
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        log.warning("ignoring unreadable %s (%s); it is rebuilt", path, exc)
        return None


def prepare_command(config_path: Path, overrides: Optional[list[str]] = None) -> int:
    """`voicesmith prepare CONFIG`: build the cache, print the data summary; DataError (exit 2) if nothing is usable."""
    from voicesmith.rundir import owned_run_dir

    config = load_config(config_path, overrides or [])
    with owned_run_dir(config.run_dir, "prepare"):  # never beside a `train` of the same run
        cache = prepare(config, progress=sys.stderr.isatty())
    print(cache.report.summary())
    stats = cache.stats
    print(f"Feature cache {cache.root}: {len(cache)} items ({stats['built']} built, {stats['reused']} reused, "
          f"{stats['failed']} failed), {len(cache.symbols)} symbols, {cache.n_speakers} speaker(s). "
          f"Report: {config.run_dir / REPORT}")
    return 0
