"""Cost of the transcript checks per hour of audio on 2 cores, against validation without them (same run).

- baseline: `validate_corpus` with the recogniser off (decode, levels, trimming, espeak-ng phonemes);
- speaking rate: the corpus-wide median/MAD pass over the validated items (its per-item facts, phoneme
  count and trimmed length, are gathered by the baseline pass itself);
- words check: `has_words` over every transcript (also part of the baseline pass);
- recogniser: pocketsphinx over every usable item in 2 worker processes, then again from its cache;
- model: a tiny acoustic run's per-item loss and alignment over its feature cache (one item per batch).

    python benchmarks/bench_intake.py --base 120 --items 240 --results benchmarks/RESULTS_intake.md

The corpus is a demo corpus tiled to --items (hard links under new ids), so every check sees the same
items; the recogniser and the model cost the same for a repeated recording as for a new one.
"""

from __future__ import annotations

import argparse
import copy
import os
import shutil
import tempfile
from pathlib import Path

from bench_data import tile_corpus, timed

from voicesmith.config import apply_override, preset_dict, validate_config
from voicesmith.data import asr_check
from voicesmith.data.speaking_rate import check_speaking_rate
from voicesmith.data.validate import ValidationCache, _item_key, has_words, validate_corpus
from voicesmith.demo_corpus import write_demo_corpus


def per_hour(seconds: float, audio_s: float) -> float:
    return seconds * 3600 / audio_s


def row(name: str, wall: float, cpu: float, audio_s: float, baseline: tuple[float, float]) -> tuple[str, ...]:
    """The CPU ratio is the steadier one on a shared machine (wall time depends on the others' load)."""
    return (name, f"{per_hour(wall, audio_s):.3g} s", f"{per_hour(cpu, audio_s):.3g} s",
            f"{wall / baseline[0]:.3g}x", f"{cpu / baseline[1]:.3g}x")


def run_config(corpus: Path, scratch: Path):
    raw = preset_dict("tiny", str(corpus))
    for override in [f"data.cache_dir={scratch / 'cache'}", "data.num_workers=0", "samples.every_n_steps=0",
                     "samples.on_best=false", "eval.every_n_steps=0", "logging.progress_bar=false"]:
        apply_override(raw, override)
    config = validate_config(raw, source="benchmark")
    config.save(scratch / "run" / "config.yaml")
    return config


def bench(corpus: Path, workers: int, scratch: Path) -> tuple[list[tuple[str, ...]], float]:
    config = run_config(corpus, scratch)
    report, base_wall, base_cpu = timed(lambda: validate_corpus(corpus, config, workers=1, cache=False))
    audio_s, baseline = report.seconds_usable, (base_wall, base_cpu)
    rows = [row(f"validation without the recogniser (baseline), {report.items_total} items", base_wall, base_cpu,
                audio_s, baseline)]
    results = copy.deepcopy(report.results)
    _, wall, cpu = timed(lambda: check_speaking_rate(results, config.data))
    rows.append(row("speaking-rate outliers (corpus pass)", wall, cpu, audio_s, baseline))
    texts = [result.item.text for result in report.results if result.item is not None]
    _, wall, cpu = timed(lambda: [has_words(text) for text in texts])
    rows.append(row("nothing to say (words check)", wall, cpu, audio_s, baseline))

    config.data.asr_check = "warn"
    for label in (f"recogniser, {workers} worker processes", "recogniser again (transcripts cached)"):
        store = ValidationCache([scratch / "asr-cache.json"])
        results = copy.deepcopy(report.results)
        record, wall, cpu = timed(lambda: asr_check.check_transcripts(results, config, store, _item_key, workers))
        rows.append(row(f"{label}: mean CER {record['mean_cer']:.2f}", wall, cpu, audio_s, baseline))

    from voicesmith.model_check import score_items
    from voicesmith.training import train

    train(config, max_steps=1)  # the cost does not depend on how far the model is trained
    scores, wall, cpu = timed(lambda: score_items(scratch / "run"))
    rows.append(row(f"model check, tiny acoustic model, {len(scores)} items one by one", wall, cpu, audio_s,
                    baseline))
    return rows, audio_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", type=int, default=120, help="demo corpus size (distinct recordings)")
    parser.add_argument("--items", type=int, default=240, help="tiled corpus size")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--results", type=Path, help="write the markdown table here")
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="bench_intake_"))
    try:
        base = write_demo_corpus(scratch / "base", n=args.base)
        rows, audio_s = bench(tile_corpus(base, scratch / "tiled", args.items), args.workers, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    load = os.getloadavg()[1] if hasattr(os, "getloadavg") else float("nan")
    table = ["| check | wall time per hour of audio | CPU time per hour of audio | wall vs baseline | CPU vs baseline |",
             "|---|---|---|---|---|", *(f"| {' | '.join(cells)} |" for cells in rows)]
    text = (f"{args.items} items, {audio_s / 60:.1f} min of audio (after trimming); per-hour figures scale the "
            f"measured times linearly.\n\n" + "\n".join(table)
            + f"\n\n{os.cpu_count()} CPUs; 5-minute load average {load:.1f} at the end of the run.\n")
    print(text)
    if args.results:
        args.results.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
