"""A published voice, read by one of the importers, becomes an ordinary voicesmith run.

RUN_DIR/config.yaml          the source's architecture, audio and text settings, fine-tuning defaults,
                             `train.init_from: imported/voice.ckpt` and `data.dataset` (relative)
RUN_DIR/imported/voice.ckpt  a voicesmith checkpoint (weights + `voicesmith` block): synth reads it,
                             and `train` starts from it through `train.init_from`
RUN_DIR/cache/symbols.json   the source's symbol table, so the run keeps the source's ids; symbols the
                             new corpus needs and the source lacks are appended (and reported)
RUN_DIR/import_report.json   what was mapped, what starts fresh and why, what of the source had no use
"""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from torch import Tensor

from voicesmith.config import VoiceConfig, preset_dict, validate_config
from voicesmith.errors import ConfigError
from voicesmith.fileio import atomic_write_json
from voicesmith.importers.mapping import ImportReport, fit_rows, load_into
from voicesmith.text import SymbolTable

IMPORTED_CHECKPOINT = "imported/voice.ckpt"
REPORT_FILE = "import_report.json"
NO_DATASET = "<your corpus folder: set data.dataset>"
# Fine-tuning a voice that already speaks: a gentler rate and far fewer steps than training from scratch
# (the vits presets: 2e-4 and up to 1,000,000 steps), and checkpoints and samples often enough to follow it.
FINE_TUNE_TRAIN = dict(learning_rate=1e-4, max_steps=20_000, warmup_steps=0, val_every_n_steps=250,
                       checkpoint_every_n_steps=250)
FINE_TUNE_SAMPLES = dict(every_n_steps=250)
# A source without some generator weights (an ONNX voice: no posterior encoder) warms up with the parts it
# filled completely held fixed (training/freeze.py). With joe-medium held, the KL term fell from about 200
# and levelled off near 30 within 40-50 steps (batch 8, benchmarks/RESULTS_finetune.md): 100 steps covers that.
WARMUP_STEPS = 100


@dataclass
class VoiceSource:
    """What an importer read: tensors under voicesmith's names and the settings to rebuild the voice."""

    kind: str  # "Piper checkpoint", "Piper ONNX", "transformers VitsModel"
    path: Path
    tensors: dict[str, Tensor]
    preset: str  # the vits preset whose remaining defaults fit best
    sections: dict[str, dict[str, Any]]  # model / audio / text / inference values read from the source
    symbols: SymbolTable
    n_speakers: int = 1
    speakers: dict[str, int] = field(default_factory=dict)
    fresh: dict[str, str] = field(default_factory=dict)  # target prefix -> why the source has no weights for it
    notes: list[str] = field(default_factory=list)


@dataclass
class ImportResult:
    config_path: Path
    checkpoint: Path
    report: ImportReport
    next_command: str


@dataclass
class ImportedVoice:
    """The source as a voicesmith model, with the config and symbol table of the run it becomes."""

    model: Any  # VitsModel, eval mode
    config: VoiceConfig
    symbols: SymbolTable
    report: ImportReport


def imported_voice(source: VoiceSource, run_dir: Path, dataset: Optional[Path] = None) -> ImportedVoice:
    """Build the model of `source`'s architecture and fill it from `source`'s tensors (nothing is written)."""
    report = ImportReport(source=str(source.path), kind=source.kind, notes=list(source.notes))
    config = _config(source, Path(run_dir), dataset)
    report.notes.append(_fine_tune_note(config))
    symbols = _with_corpus_symbols(source.symbols, config, dataset, report)
    model = _filled_model(source, config, symbols, report)
    _hold_imported_parts(model, config, report)
    return ImportedVoice(model, config, symbols, report)


def write_voice_run(source: VoiceSource, run_dir: Path, dataset: Optional[Path]) -> ImportResult:
    """Import `source` and write the run (see the module docstring)."""
    run_dir = Path(run_dir)
    config_path = run_dir / "config.yaml"
    if config_path.exists():
        raise ConfigError(f"{config_path} already exists; import into a new RUN_DIR (an import never overwrites a run).")
    voice = imported_voice(source, run_dir, dataset)
    model, config, symbols, report = voice.model, voice.config, voice.symbols, voice.report
    run_dir.mkdir(parents=True, exist_ok=True)
    checkpoint = _save(model, config, symbols, source.speakers, run_dir, report)
    config.save(config_path)
    atomic_write_json(run_dir / REPORT_FILE, report.to_dict(), indent=1)
    command = f"voicesmith train {config_path}"
    if dataset is None:
        command = f"(set data.dataset in {config_path}) then: {command}"
    return ImportResult(config_path, checkpoint, report, command)


def _config(source: VoiceSource, run_dir: Path, dataset: Optional[Path]) -> VoiceConfig:
    if dataset is not None and not Path(dataset).exists():
        raise ConfigError(f"--dataset {dataset} does not exist. Give a corpus folder (LJSpeech or VCTK layout) or "
                          f"a filelist; `voicesmith demo-corpus DIR` makes one to try.")
    relative = os.path.relpath(Path(dataset).resolve(), run_dir.resolve()) if dataset is not None else NO_DATASET
    raw = preset_dict(source.preset, relative, "vits")
    for section, values in source.sections.items():
        raw.setdefault(section, {}).update(copy.deepcopy(values))
    raw["train"].update(FINE_TUNE_TRAIN, init_from=IMPORTED_CHECKPOINT)
    raw.setdefault("samples", {}).update(FINE_TUNE_SAMPLES)
    config = validate_config(raw, source=f"the settings read from {source.path}")
    config._path = (run_dir / "config.yaml").resolve()
    return config


def _fine_tune_note(config: VoiceConfig) -> str:
    from voicesmith.config import make_config

    scratch = make_config("", "medium", "vits").train
    train = config.train
    return (f"Fine-tuning defaults (training from scratch in brackets): learning rate {train.learning_rate:g} "
            f"({scratch.learning_rate:g}), max_steps {train.max_steps:,} ({scratch.max_steps:,}), warmup "
            f"{train.warmup_steps}, checkpoints every {train.checkpoint_every_n_steps} steps; change them with "
            f"--set train.KEY=VALUE.")


def _with_corpus_symbols(symbols: SymbolTable, config: VoiceConfig, dataset: Optional[Path],
                         report: ImportReport) -> SymbolTable:
    """The source's table plus, at new ids after its last, every symbol the corpus uses that it lacks."""
    if dataset is None:
        return symbols
    from voicesmith.data.formats import read_corpus
    from voicesmith.text import TextFrontend

    texts = [item.text for item in read_corpus(Path(dataset), config.data.format).items]
    new: list[str] = []
    for encoded in TextFrontend(config.text, symbols).encode_batch(texts):
        new += [symbol for symbol in encoded.unknown if symbol not in new and symbol.strip()]
    if not new:
        report.notes.append(f"Symbol table: the source's ({len(symbols)} ids); the corpus needs no new symbol.")
        return symbols
    table = symbols.phoneme_id_map
    for offset, symbol in enumerate(new):
        table[symbol] = [len(symbols) + offset]
    report.notes.append(f"Symbol table: the source's {len(symbols)} ids, plus {len(new)} symbols of the corpus the "
                        f"source lacks, appended with fresh embedding rows: {' '.join(new)}")
    return SymbolTable(table, kind=symbols.kind)


def _filled_model(source: VoiceSource, config: VoiceConfig, symbols: SymbolTable, report: ImportReport):
    from voicesmith.models import build_model

    model = build_model(config.model, len(symbols), config.audio.n_mels, source.n_speakers, None, config.audio)
    tensors = dict(source.tensors)
    state = model.state_dict()
    for name in getattr(model, "symbol_tables", ()):
        if name in tensors:
            tensors[name] = fit_rows(tensors[name], state[name], name, report)
    load_into(model, tensors, report, source.fresh)
    return model.eval()


def _hold_imported_parts(model, config: VoiceConfig, report: ImportReport) -> None:
    """When generator weights start fresh, the first steps hold what the source filled completely."""
    from voicesmith.training.freeze import whole_parts

    fresh = {name for names in report.fresh.values() for name in names}
    if not any(not name.startswith("discriminator.") for name in fresh):
        return
    config.train.freeze = whole_parts(model, fresh, skip=("discriminator",))
    config.train.freeze_steps = WARMUP_STEPS
    report.notes.append(f"Warm-up: for the first {WARMUP_STEPS} steps the parts the source filled completely stay "
                        f"fixed ({', '.join(config.train.freeze)}) while the fresh ones learn against them; "
                        f"--set train.freeze_steps=0 trains everything from the first step.")


def _save(model, config: VoiceConfig, symbols: SymbolTable, speakers: dict[str, int], run_dir: Path,
          report: ImportReport) -> Path:
    from voicesmith.checkpoint import MODEL_PREFIX, atomic_save, voicesmith_block
    from voicesmith.data.cache import SYMBOLS

    path = run_dir / IMPORTED_CHECKPOINT
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {MODEL_PREFIX + name: tensor for name, tensor in model.state_dict().items()}
    atomic_save({"state_dict": state, "voicesmith": voicesmith_block(config, symbols, speakers, 0),
                 "import_report": report.to_dict()}, path)
    symbols.save(config.resolve(config.data.cache_dir) / SYMBOLS)
    return path
