"""`voicesmith eval`: is the voice getting better? Intelligibility, distortion and speed, offline.

For each item the voice speaks the item's text, and the result is set against the item's recording:

- intelligibility: pocketsphinx transcribes both the synthesised audio and the recording (each whole,
  as produced / as recorded); CER and WER of each against the text (`asr.py`). The recording's scores
  say what the recogniser manages on real speech, the ceiling for the voice's;
- distortion: MCD between the two with DTW (`mcd.py` states the definition), and the duration ratio
  synthesised / recorded; both on the speech span (leading/trailing silence trimmed on both sides
  with the voice's `data.trim_top_db`);
- speed: real-time factor of synthesis on this machine = synthesis wall time / audio seconds (after
  one untimed warm-up synthesis, which pays the process's one-off costs);
- naturalness: DNSMOS (`dnsmos.py`: P.835 OVRL/SIG/BAK and P.808, predicted MOS 1-5) of the synthesised
  audio as produced and of the recording as recorded; no recogniser needed, so every language gets it.

Totals: CER/WER are corpus-level (all edits / all reference characters or words), MCD and the DNSMOS
scores are means over items, duration ratio and RTF are ratios of sums. Languages without a recogniser
model (all but English) get distortion, naturalness and speed only, with a note. Items: a run's
validation split (the same deterministic split training used) unless a dataset is given; then its
usable items, in order.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np

from voicesmith.asr import error_rates, has_recognizer, normalize_for_asr, recognizer_name, transcribe
from voicesmith.audio import load_audio, resample, to_mono, trim_silence
from voicesmith.config import VoiceConfig
from voicesmith.data.formats import CorpusItem
from voicesmith.dnsmos import DEFINITION as DNSMOS_DEFINITION
from voicesmith.dnsmos import SCORES as DNSMOS_SCORES
from voicesmith.dnsmos import DnsmosScores
from voicesmith.dnsmos import scorer as dnsmos_scorer
from voicesmith.errors import DataError, UserInputError
from voicesmith.inference import Synthesizer
from voicesmith.mcd import DEFINITION as MCD_DEFINITION
from voicesmith.mcd import mel_cepstral_distortion
from voicesmith.onnx_voice import is_onnx_voice
from voicesmith.text import SymbolTable

__all__ = ["Reference", "dataset_items", "error_rates", "eval_command", "evaluate", "format_table",
           "mel_cepstral_distortion", "normalize_for_asr", "transcribe", "validation_items"]

DNSMOS_KEYS = tuple(f"{side}dnsmos_{name}" for side in ("", "reference_") for name in DNSMOS_SCORES)


@dataclass
class Reference:
    """What evaluation needs of a recording; the same every time, so training keeps them between runs."""

    audio: np.ndarray  # mono at the voice's rate, trimmed
    seconds: float
    transcript: Optional[str]  # None when the language has no recogniser
    dnsmos: DnsmosScores  # of the recording as recorded


# --- items ---------------------------------------------------------------------------------------

def validation_items(config: VoiceConfig, symbols: Optional[SymbolTable] = None) -> list[CorpusItem]:
    """The validation split training used for this config (from its feature cache when it has one)."""
    from voicesmith.data.cache import FeatureCache, audio_key
    from voicesmith.data.loader import split_entries

    data = config.data
    try:
        cache = FeatureCache.load(config.resolve(data.cache_dir))
        entries = cache.entries if cache.audio_key == audio_key(config) else None
    except DataError:
        entries = None
    if entries is None:  # no cache: the usable items, as preparing it would find them
        usable = _usable_items(_run_dataset(config), config, data.format, symbols)
        entries = [{"id": item.id, "line": item.line, "speaker": item.speaker, "text": item.text,
                    "source": {"path": str(item.audio_path)}} for item in usable]
    _, val = split_entries(entries, data.val_fraction, data.val_max_items, data.seed)
    if not val:
        raise UserInputError(f"The run in {config.run_dir} has no validation items (data.val_fraction="
                             f"{data.val_fraction}, {len(entries)} usable items); name a DATASET to evaluate on.")
    return [CorpusItem(entries[i]["id"], entries[i].get("line"), Path(entries[i]["source"]["path"]),
                       entries[i]["text"], entries[i].get("speaker", "")) for i in val]


def dataset_items(dataset: Path, config: VoiceConfig, symbols: Optional[SymbolTable] = None) -> list[CorpusItem]:
    """The usable items of a dataset (validated with the voice's settings), in corpus order."""
    if not Path(dataset).exists():
        raise UserInputError(f"Dataset {dataset} does not exist. Pass a corpus folder (LJSpeech or VCTK layout) "
                             f"or a filelist.")
    return _usable_items(Path(dataset), config, "auto", symbols)


def _usable_items(dataset: Path, config: VoiceConfig, format: str, symbols: Optional[SymbolTable]) -> list[CorpusItem]:
    from voicesmith.data.validate import validate_corpus

    report = validate_corpus(dataset, config, format, symbols=symbols)
    if not report.usable_items:
        reasons = "; ".join(report.top_reasons())
        raise DataError(f"No usable item in {dataset} ({report.items_total} items): {reasons}. "
                        f"Run `voicesmith validate {dataset}` for the full list.")
    return report.usable_items


def _run_dataset(config: VoiceConfig) -> Path:
    dataset = config.resolve(config.data.dataset)
    if not dataset.exists():
        raise UserInputError(f"The voice was trained on {dataset}, which is not there (the model is not in its run "
                             f"directory, or the data moved). Name the DATASET to evaluate on: "
                             f"`voicesmith eval MODEL DATASET`.")
    return dataset


# --- evaluation ----------------------------------------------------------------------------------

def load_reference(item: CorpusItem, config: VoiceConfig, with_transcript: bool) -> Reference:
    audio, sample_rate = load_audio(item.audio_path)
    audio = to_mono(audio)
    transcript = transcribe(audio, sample_rate) if with_transcript else None
    speech = _speech(resample(audio, sample_rate, config.audio.sample_rate), config)
    return Reference(speech, len(speech) / config.audio.sample_rate, transcript,
                     dnsmos_scorer().score(audio, sample_rate))


def _speech(audio: np.ndarray, config: VoiceConfig) -> np.ndarray:
    """The span between leading and trailing silence (all of it when it is silent throughout)."""
    trimmed, _, _ = trim_silence(audio, config.audio.sample_rate, config.data.trim_top_db)
    return trimmed if trimmed.size else audio


def evaluate(synth: Synthesizer, items: list[CorpusItem], limit: Optional[int] = None,
             references: Optional[dict[str, Reference]] = None) -> dict:
    """Scores of `synth` on `items` (the first `limit`), as DESIGN.md's eval JSON.

    `references` caches the recordings' side by item id (filled here), for repeated evaluations.
    """
    config, language = synth.config, synth.config.text.language
    with_asr = has_recognizer(language)
    references = {} if references is None else references
    items = items[:limit]
    if not items:
        raise UserInputError("No item to evaluate (the item list is empty).")
    dnsmos_scorer()  # loads the naturalness models once; refuses before any work when they are not installed
    # untimed: the first synthesis of a process pays one-off costs that are not its speed
    synth.synthesize(items[0].text, _speaker(synth, items[0]))
    rows, notes = [], []
    for item in items:
        if item.id not in references:
            references[item.id] = load_reference(item, config, with_asr)
        rows.append(_score_item(synth, item, references[item.id], with_asr))
    unknown_speakers = {item.speaker for item in items if item.speaker and _speaker(synth, item) is None}
    if unknown_speakers:
        notes.append(f"{len(unknown_speakers)} speaker(s) of the data are unknown to the voice "
                     f"({', '.join(sorted(unknown_speakers))}); their items were spoken by its first speaker.")
    return {"n_items": len(rows), "language": language, "recognizer": recognizer_name() if with_asr else None,
            **_asr_totals(rows, language, with_asr, notes), **_other_totals(rows),
            "mcd_definition": MCD_DEFINITION, "dnsmos_definition": DNSMOS_DEFINITION, "notes": notes, "items": rows}


def _speaker(synth: Synthesizer, item: CorpusItem) -> Optional[str]:
    """The item's speaker when the voice knows it; else None (the voice's first speaker)."""
    return item.speaker if item.speaker in synth.speakers else None


def _score_item(synth: Synthesizer, item: CorpusItem, reference: Reference, with_asr: bool) -> dict:
    config = synth.config
    started = time.perf_counter()
    audio, sample_rate = synth.synthesize(item.text, _speaker(synth, item))
    synthesis_seconds = time.perf_counter() - started
    speech = _speech(audio, config)
    row = {"id": item.id, "speaker": item.speaker, "text": item.text,
           "transcript": transcribe(audio, sample_rate) if with_asr else None,
           "reference_transcript": reference.transcript,
           "cer": None, "wer": None, "reference_cer": None, "reference_wer": None,
           "mcd": mel_cepstral_distortion(speech, reference.audio, sample_rate),
           "duration_ratio": (len(speech) / sample_rate) / reference.seconds,
           "seconds": len(speech) / sample_rate, "reference_seconds": reference.seconds,
           "audio_seconds": len(audio) / sample_rate, "synthesis_seconds": synthesis_seconds,
           "rtf": synthesis_seconds / max(len(audio) / sample_rate, 1e-9),
           **dnsmos_scorer().score(audio, sample_rate).as_dict(), **reference.dnsmos.as_dict("reference_dnsmos_")}
    if with_asr and normalize_for_asr(item.text, config.text.language):
        row["cer"], row["wer"] = error_rates(item.text, row["transcript"], config.text.language)
        row["reference_cer"], row["reference_wer"] = error_rates(item.text, reference.transcript,
                                                                 config.text.language)
    return row


def _asr_totals(rows: list[dict], language: str, with_asr: bool, notes: list[str]) -> dict:
    totals = {"cer": None, "wer": None, "reference_cer": None, "reference_wer": None}
    if not with_asr:
        notes.append(f"No speech recogniser for language {language!r} (pocketsphinx ships English only): "
                     f"intelligibility (CER/WER) is not measured; distortion, naturalness and speed are.")
        return totals
    scored = [row for row in rows if row["cer"] is not None]
    if len(scored) < len(rows):
        notes.append(f"{len(rows) - len(scored)} item(s) have no words after normalisation and are left out "
                     f"of CER/WER.")
    if scored:
        texts = [row["text"] for row in scored]
        totals["cer"], totals["wer"] = error_rates(texts, [row["transcript"] for row in scored], language)
        totals["reference_cer"], totals["reference_wer"] = error_rates(
            texts, [row["reference_transcript"] for row in scored], language)
    return totals


def _other_totals(rows: list[dict]) -> dict:
    audio_seconds = sum(row["audio_seconds"] for row in rows)
    synthesis_seconds = sum(row["synthesis_seconds"] for row in rows)
    return {"mcd": float(np.mean([row["mcd"] for row in rows])),
            "duration_ratio": sum(row["seconds"] for row in rows) / sum(row["reference_seconds"] for row in rows),
            "rtf": synthesis_seconds / max(audio_seconds, 1e-9),
            "audio_seconds": audio_seconds, "synthesis_seconds": synthesis_seconds,
            **{key: float(np.mean([row[key] for row in rows])) for key in DNSMOS_KEYS}}


# --- the command ---------------------------------------------------------------------------------

def eval_command(model_path: Path, dataset: Optional[Path] = None, limit: Optional[int] = None,
                 json_path: Optional[Path] = None) -> int:
    """`voicesmith eval MODEL [DATASET]`: print the table, write the JSON when asked; 0 on success.

    DATASET is optional: without it, a run directory (or a checkpoint inside one) is evaluated on
    the validation split its training used.
    """
    if limit is not None and limit < 1:
        raise UserInputError(f"--limit must be at least 1; got {limit}.")
    if dataset is None and is_onnx_voice(model_path):
        raise UserInputError(f"{model_path} is an ONNX voice: it carries no run, so no validation split. Name the "
                             f"items to score: `voicesmith eval {model_path} DATASET`.")
    synth = Synthesizer.load(Path(model_path))
    if dataset is None:
        items, source = validation_items(synth.config, synth.symbols), "validation split"
    else:
        items, source = dataset_items(Path(dataset), synth.config, synth.symbols), "dataset"
    dataset = dataset or synth.config.resolve(synth.config.data.dataset)
    result = {"model": str(model_path), "dataset": str(dataset), "items_from": source,
              **evaluate(synth, items, limit)}
    print(format_table(result))
    if json_path is not None:
        json_path = Path(json_path)
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        print(f"Written to {json_path}")
    return 0


COLUMNS = (("CER", "cer"), ("ref CER", "reference_cer"), ("WER", "wer"), ("ref WER", "reference_wer"),
           ("MCD dB", "mcd"), ("dur ratio", "duration_ratio"), ("RTF", "rtf"))
DNSMOS_COLUMNS = (("OVRL", "dnsmos_ovrl"), ("ref OVRL", "reference_dnsmos_ovrl"), ("SIG", "dnsmos_sig"),
                  ("ref SIG", "reference_dnsmos_sig"), ("BAK", "dnsmos_bak"), ("ref BAK", "reference_dnsmos_bak"),
                  ("P.808", "dnsmos_p808"), ("ref P.808", "reference_dnsmos_p808"))


def format_table(result: dict) -> str:
    """Items, then the totals: intelligibility, distortion and speed; then naturalness; then the notes
    (plain text, fixed width)."""
    lines = _table(result, COLUMNS) + [""] + _table(result, DNSMOS_COLUMNS)
    lines += [result["mcd_definition"], result["dnsmos_definition"]]
    lines += [f"note: {note}" for note in result["notes"]]
    return "\n".join(lines)


def _table(result: dict, columns: tuple[tuple[str, str], ...]) -> list[str]:
    rows = [(row["id"], *(row[key] for _, key in columns)) for row in result["items"]]
    rows.append((f"all ({result['n_items']})", *(result[key] for _, key in columns)))
    width = max(len("item"), *(len(str(row[0])) for row in rows))
    header = f"{'item':<{width}}" + "".join(f"{title:>10}" for title, _ in columns)
    lines = [header, "-" * len(header)]
    for index, row in enumerate(rows):
        if index == len(rows) - 1:
            lines.append("-" * len(header))
        lines.append(f"{row[0]:<{width}}" + "".join(f"{_cell(value):>10}" for value in row[1:]))
    return lines


def _cell(value: Optional[float]) -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.3f}"
