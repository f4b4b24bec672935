"""DNSMOS in `voicesmith eval`: cost per minute of audio, against the `speechmos` package's own scorer
in the same run.

Both run the same two ONNX models with onnxruntime on the CPU; they differ in the P.808 features
(numpy here, librosa there), in batching (here the windows of a clip, or of several clips, go through
the models together; there one window per call) and in the windows of long clips (the package skips
windows 8-24 of clips over 17 s to float rounding; here all count, so here does more work there).
Workloads, at 16 kHz, taken in turn round by round so that load drift hits both alike:

- long: one minute of demo-corpus speech as one clip (51 windows of 9.01 s);
- items: the recordings of a demo corpus one by one, as `eval` scores them (each repeated to 9.01 s
  or more first, so a 2-5 s item costs one to nine windows);
- features: P.808 log-mels of the long clip's windows alone (numpy against librosa).

    python benchmarks/bench_dnsmos.py --items 20 --threads 2 --results benchmarks/RESULTS_dnsmos.md
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
import time
from pathlib import Path
from typing import Callable

import numpy as np

from voicesmith import dnsmos
from voicesmith.audio import load_audio, to_mono
from voicesmith.data.formats import read_corpus
from voicesmith.demo_corpus import write_demo_corpus


def demo_speech(n_items: int) -> list[np.ndarray]:
    """n demo-corpus recordings, mono at 16 kHz."""
    with tempfile.TemporaryDirectory() as tmp:
        corpus = read_corpus(write_demo_corpus(Path(tmp) / "demo", n=n_items))
        clips = [load_audio(item.audio_path) for item in corpus.items]
    return [dnsmos.prepare(to_mono(audio), rate) for audio, rate in clips]


def one_minute(clips: list[np.ndarray]) -> np.ndarray:
    audio = np.concatenate(clips)
    while audio.size < 60 * dnsmos.SAMPLE_RATE:
        audio = np.concatenate([audio, audio])
    return audio[:60 * dnsmos.SAMPLE_RATE]


def librosa_features(windows: np.ndarray, package) -> list[np.ndarray]:
    return [package.dnsmos.audio_melspec(window[:-160]) for window in windows]


def timed(work: Callable[[], object]) -> float:
    started = time.perf_counter()
    work()
    return time.perf_counter() - started


def run(n_items: int, threads: int, rounds: int) -> dict:
    from speechmos import dnsmos as package

    clips = demo_speech(n_items)
    long_clip = one_minute(clips)
    ours = dnsmos.DnsmosScorer(threads=threads)
    package.run(clips[0], dnsmos.SAMPLE_RATE)  # loads its sessions (default options) before the clock runs
    ours.score(clips[0], dnsmos.SAMPLE_RATE)
    windows = dnsmos.model_windows(long_clip)
    work = {
        ("long", "ours"): lambda: ours.score(long_clip, dnsmos.SAMPLE_RATE),
        ("long", "package"): lambda: package.run(long_clip, dnsmos.SAMPLE_RATE),
        ("items", "ours"): lambda: [ours.score(clip, dnsmos.SAMPLE_RATE) for clip in clips],
        ("items batched", "ours"): lambda: ours.score_many([(clip, dnsmos.SAMPLE_RATE) for clip in clips]),
        ("items", "package"): lambda: [package.run(clip, dnsmos.SAMPLE_RATE) for clip in clips],
        ("features", "ours"): lambda: [dnsmos.p808_features(windows[start:start + dnsmos.BATCH_WINDOWS])
                                       for start in range(0, len(windows), dnsmos.BATCH_WINDOWS)],  # as scored
        ("features", "package"): lambda: librosa_features(windows, package),
    }
    seconds = {key: [] for key in work}
    for _ in range(rounds):
        for key, job in work.items():
            seconds[key].append(timed(job))
    item_windows = sum(len(dnsmos.model_windows(clip)) for clip in clips)
    package_windows = sum(int((index + 9.01) * dnsmos.SAMPLE_RATE) - index * dnsmos.SAMPLE_RATE
                          == dnsmos.WINDOW_SAMPLES for index in range(len(windows)))  # its float bounds
    return {"best": {key: min(values) for key, values in seconds.items()}, "threads": threads, "rounds": rounds,
            "items": len(clips), "items_seconds": sum(clip.size for clip in clips) / dnsmos.SAMPLE_RATE,
            "item_windows": item_windows, "long_windows": len(windows),
            "package_long_windows": package_windows, "load": os.getloadavg()}


def report(result: dict) -> str:
    best = result["best"]
    items_minutes = result["items_seconds"] / 60
    long_windows, item_windows = result["long_windows"], result["item_windows"]
    rows = [  # label, workload, minutes of audio, windows scored by voicesmith and by the package
        ("one 60 s clip", "long", 1.0, long_windows, result["package_long_windows"]),
        (f"{result['items']} eval items, one by one", "items", items_minutes, item_windows, item_windows),
        (f"{result['items']} eval items, `score_many`", "items batched", items_minutes, item_windows, item_windows),
        ("P.808 features of the 60 s clip's windows", "features", 1.0, long_windows, long_windows),
    ]
    lines = [
        "# DNSMOS benchmark (naturalness in `voicesmith eval`)", "",
        f"{platform.machine()}, {os.cpu_count()} CPU cores shared with other jobs (load average "
        f"{result['load'][0]:.1f} at the end), onnxruntime intra-op threads: ours {result['threads']}, the "
        f"package's default; best of {result['rounds']} rounds, the two taking turns in each round. Demo-corpus "
        f"speech at 16 kHz; seconds of compute per minute of audio (lower is better).", "",
        "| workload | windows scored (voicesmith / package) | voicesmith (s / min of audio) | "
        "speechmos package (s / min) | package / voicesmith | per window: package / voicesmith |",
        "|---|---|---|---|---|---|",
    ]
    for label, key, minutes, our_windows, their_windows in rows:
        ours, theirs = best[(key, "ours")] / minutes, best[(key.split()[0], "package")] / minutes
        per_window = (theirs / their_windows) / (ours / our_windows)
        lines.append(f"| {label} | {our_windows} / {their_windows} | {ours:.2f} | {theirs:.2f} | "
                     f"{theirs / ours:.2f}x | {per_window:.2f}x |")
    lines += ["", f"The {result['items']} items hold {result['items_seconds']:.0f} s of speech; each is "
                  f"repeated to at least 9.01 s before scoring, so short items cost whole windows.", ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=20)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--results", type=Path)
    args = parser.parse_args()
    text = report(run(args.items, args.threads, args.rounds))
    print(text)
    if args.results:
        args.results.write_text(text + f"\nReproduce: `python benchmarks/bench_dnsmos.py --items {args.items} "
                                f"--threads {args.threads} --results benchmarks/RESULTS_dnsmos.md`.\n",
                                encoding="utf-8")


if __name__ == "__main__":
    main()
