"""Dataset intake speed and batching efficiency, each against a baseline measured in the same run.

- validation of a large corpus (a demo corpus tiled to --items by linking its wavs under new ids):
  2 worker processes vs in-process, and the cached second run;
- preparation (features of --prepare-items items): 2 worker processes vs in-process, as x real time;
- padding waste of length-bucketed batches vs random batches on the demo corpus.

    python benchmarks/bench_data.py --items 10000 --results benchmarks/RESULTS_data.md

The tiled corpus repeats --base recordings, so after the first pass they come from the page cache:
the numbers leave out cold disk reads.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

try:
    import resource
except ImportError:  # Windows
    resource = None

from voicesmith.config import DataConfig, VoiceConfig
from voicesmith.data import cache as cache_module
from voicesmith.data import validate as validate_module
from voicesmith.data.cache import prepare
from voicesmith.data.sampler import LengthBucketBatchSampler, padding_waste
from voicesmith.data.validate import validate_corpus
from voicesmith.demo_corpus import write_demo_corpus


def tile_corpus(base: Path, out: Path, n: int) -> Path:
    """An LJSpeech corpus of n items whose wavs are hard links to the base corpus's (no copies)."""
    rows = [line.split("|") for line in (base / "metadata.csv").read_text(encoding="utf-8").splitlines()]
    (out / "wavs").mkdir(parents=True)
    lines = []
    for index in range(n):
        item_id, text, normalized = rows[index % len(rows)]
        new_id = f"tile-{index:05d}"
        os.link(base / "wavs" / f"{item_id}.wav", out / "wavs" / f"{new_id}.wav")
        lines.append(f"{new_id}|{text}|{normalized}")
    (out / "metadata.csv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return out


def cpu_seconds() -> float:
    """CPU time of this process and its finished children (worker pools are joined before we read it)."""
    if resource is None:
        return float("nan")
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def timed(function):
    """(result, wall seconds, CPU seconds): on a shared machine the CPU time is the steadier number."""
    start, cpu = time.perf_counter(), cpu_seconds()
    result = function()
    return result, time.perf_counter() - start, cpu_seconds() - cpu


def speed(audio_s: float, wall: float, cpu: float) -> str:
    return f"{wall:.1f} s = {audio_s / wall:.0f}x real time (CPU {cpu:.1f} s = {audio_s / cpu:.0f}x real time per core)"


def bench_validation(corpus: Path, workers: int, scratch: Path) -> list[tuple[str, str]]:
    config = VoiceConfig(data=DataConfig(dataset=str(corpus)))
    serial, serial_s, serial_cpu = timed(lambda: validate_corpus(corpus, config, workers=1, cache=False))
    _, parallel_s, parallel_cpu = timed(lambda: validate_corpus(corpus, config, workers=workers,
                                                                cache=scratch / "vcache"))
    _, cached_s, _ = timed(lambda: validate_corpus(corpus, config, workers=workers, cache=scratch / "vcache"))
    audio_s, n = serial.seconds_usable, serial.items_total
    return [
        (f"validate {n} items ({audio_s / 3600:.1f} h), in-process (baseline)", speed(audio_s, serial_s, serial_cpu)),
        (f"validate {n} items, {workers} worker processes",
         f"{speed(audio_s, parallel_s, parallel_cpu)}; {serial_s / parallel_s:.2f}x the baseline"),
        (f"validate {n} items again (cached)", f"{cached_s:.2f} s; {serial_s / cached_s:.0f}x faster than the baseline"),
    ]


def bench_preparation(corpus: Path, workers: int, scratch: Path) -> list[tuple[str, str]]:
    rows, walls = [], {}
    for label, count in (("in-process (baseline)", 1), (f"{workers} worker processes", workers)):
        config = VoiceConfig(data=DataConfig(dataset=str(corpus), cache_dir=str(scratch / f"cache-{count}")))
        report = validate_corpus(corpus, config, workers=workers)  # cached in the corpus folder after the first
        cache, wall, cpu = timed(lambda: prepare(config, report=report, progress=False, workers=count))
        walls[count] = wall
        audio_s = sum(cache.lengths) * config.audio.hop_length / config.audio.sample_rate
        ratio = f"; {walls[1] / wall:.2f}x the baseline" if count != 1 else ""
        rows.append((f"prepare {len(cache)} items ({audio_s / 3600:.1f} h), {label}", speed(audio_s, wall, cpu) + ratio))
    config = VoiceConfig(data=DataConfig(dataset=str(corpus), cache_dir=str(scratch / f"cache-{workers}")))
    _, again, _ = timed(lambda: prepare(config, progress=False, workers=workers))
    rows.append(("prepare again (nothing changed: validation cached, features reused)", f"{again:.2f} s"))
    return rows


def bench_padding(corpus: Path, scratch: Path, batch_size: int = 16, epochs: int = 5) -> list[tuple[str, str]]:
    config = VoiceConfig(data=DataConfig(dataset=str(corpus), cache_dir=str(scratch / "cache-pad")))
    lengths = np.asarray(prepare(config, progress=False).lengths)
    bucketed, random = [], []
    for epoch in range(epochs):
        sampler = LengthBucketBatchSampler(lengths, batch_size, seed=0)
        sampler.set_epoch(epoch)
        bucketed.append(padding_waste(list(sampler), lengths))
        order = np.random.default_rng(epoch).permutation(len(lengths))
        random.append(padding_waste([order[i:i + batch_size] for i in range(0, len(order), batch_size)], lengths))
    b, r = float(np.mean(bucketed)), float(np.mean(random))
    return [(f"padding waste, random batches of {batch_size} (baseline), {len(lengths)} demo items", f"{100 * r:.1f}%"),
            (f"padding waste, length-bucketed batches of {batch_size}", f"{100 * b:.1f}% ({r / b:.1f}x less padding)")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", type=int, default=300, help="demo corpus size (distinct recordings)")
    parser.add_argument("--items", type=int, default=10_000, help="tiled corpus size for validation")
    parser.add_argument("--prepare-items", type=int, default=2_000, help="tiled corpus size for preparation")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--results", type=Path, help="write the markdown table here")
    args = parser.parse_args()
    # the benchmark always compares worker processes with in-process, whatever the size
    cache_module.PARALLEL_MIN_ITEMS = validate_module.PARALLEL_MIN_ITEMS = 1

    scratch = Path(tempfile.mkdtemp(prefix="bench_data_"))
    try:
        base = write_demo_corpus(scratch / "base", n=args.base)
        rows = bench_padding(base, scratch)
        rows += bench_validation(tile_corpus(base, scratch / "tiled", args.items), args.workers, scratch)
        rows += bench_preparation(tile_corpus(base, scratch / "tiled-prepare", args.prepare_items), args.workers,
                                  scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    load = os.getloadavg()[1] if hasattr(os, "getloadavg") else float("nan")
    table = ["| measurement | result |", "|---|---|", *(f"| {name} | {value} |" for name, value in rows)]
    text = "\n".join(table) + f"\n\n{os.cpu_count()} CPUs; 5-minute load average {load:.1f} at the end of the run.\n"
    print(text)
    if args.results:
        args.results.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
