"""The recogniser behind `voicesmith eval`: accuracy on real speech and speed, against baselines in the same run.

On the recordings of a demo corpus (espeak-ng speech), three ways to decode each recording, taken in
turn item by item so that drift in the machine's load hits all three alike:

- voicesmith: `asr.transcribe` (levelled to -20 dBFS RMS, -55 dBFS noise floor, narrowed search);
- defaults: the same conditioning, pocketsphinx's default search (the speed baseline);
- raw: the narrowed search on the unconditioned 16 kHz samples (the accuracy baseline).

Also the time of one MCD (mel-cepstra + DTW) per item, against the time to transcribe it.

    python benchmarks/bench_eval.py --items 40 --results benchmarks/RESULTS_eval.md
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
import time
from pathlib import Path

import numpy as np
from pocketsphinx import Decoder

from voicesmith.asr import ASR_SAMPLE_RATE, DECODER_OPTIONS, condition_for_asr, error_rates, transcribe
from voicesmith.audio import load_audio, resample, to_mono
from voicesmith.data.formats import read_corpus
from voicesmith.demo_corpus import write_demo_corpus
from voicesmith.mcd import mel_cepstral_distortion


def decode(decoder: Decoder, samples: np.ndarray) -> str:
    decoder.reinit_feat()
    decoder.start_utt()
    decoder.process_raw(samples.tobytes(), no_search=False, full_utt=True)
    decoder.end_utt()
    hypothesis = decoder.hyp()
    return hypothesis.hypstr if hypothesis is not None else ""


def raw_samples(audio: np.ndarray, sample_rate: int) -> np.ndarray:
    return (np.clip(resample(audio, sample_rate, ASR_SAMPLE_RATE), -1, 1) * 32767).astype(np.int16)


def run(n_items: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        corpus = read_corpus(write_demo_corpus(Path(tmp) / "demo", n=n_items))
        recordings = [(item.text, *_mono(item.audio_path)) for item in corpus.items]
    defaults, narrowed = Decoder(loglevel="FATAL"), Decoder(**DECODER_OPTIONS)
    transcribe(np.zeros(1600, np.float32), ASR_SAMPLE_RATE)  # load the model before the clock runs
    ways = {
        "voicesmith": lambda audio, sr: transcribe(audio, sr),
        "defaults": lambda audio, sr: decode(defaults, condition_for_asr(audio, sr)),
        "raw": lambda audio, sr: decode(narrowed, raw_samples(audio, sr)),
    }
    transcripts = {name: [] for name in ways}
    seconds = {name: 0.0 for name in ways}
    mcd_seconds = 0.0
    for index, (_, audio, sample_rate) in enumerate(recordings):
        for name, way in ways.items():
            started = time.perf_counter()
            transcripts[name].append(way(audio, sample_rate))
            seconds[name] += time.perf_counter() - started
        other = recordings[(index + 1) % len(recordings)]
        started = time.perf_counter()
        mel_cepstral_distortion(audio, resample(other[1], other[2], sample_rate), sample_rate)
        mcd_seconds += time.perf_counter() - started
    texts = [text for text, _, _ in recordings]
    audio_seconds = sum(len(audio) / sr for _, audio, sr in recordings)
    return {"items": len(recordings), "audio_seconds": audio_seconds, "mcd_seconds": mcd_seconds,
            "ways": {name: {"cer_wer": error_rates(texts, transcripts[name]), "rtf": seconds[name] / audio_seconds,
                            "seconds": seconds[name]} for name in ways}}


def _mono(path: Path) -> tuple[np.ndarray, int]:
    audio, sample_rate = load_audio(path)
    return to_mono(audio), sample_rate


def report(result: dict) -> str:
    ways = result["ways"]
    ours = ways["voicesmith"]
    lines = [
        "# Evaluation benchmarks (recogniser and MCD)", "",
        f"Demo corpus, {result['items']} espeak-ng recordings ({result['audio_seconds']:.0f} s of speech); "
        f"{platform.machine()}, {os.cpu_count()} CPU cores, one process; the three decodings take turns item by "
        f"item, so load drift hits all alike. RTF = decoding time / audio time.", "",
        "| decoding | CER | WER | RTF | vs voicesmith |", "|---|---|---|---|---|",
    ]
    for name, label in (("voicesmith", "voicesmith (levelled + noise floor, narrowed search)"),
                        ("defaults", "same conditioning, pocketsphinx default search"),
                        ("raw", "narrowed search, unconditioned samples")):
        way = ways[name]
        cer, wer = way["cer_wer"]
        lines.append(f"| {label} | {cer:.3f} | {wer:.3f} | {way['rtf']:.3f} | "
                     f"CER x{cer / ours['cer_wer'][0]:.2f}, time x{way['seconds'] / ours['seconds']:.2f} |")
    lines += ["", f"MCD (mel-cepstra + DTW) of each recording against another: "
                  f"{1000 * result['mcd_seconds'] / result['items']:.1f} ms per item, "
                  f"{result['mcd_seconds'] / ours['seconds']:.3f}x the time to transcribe it.", ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=40)
    parser.add_argument("--results", type=Path)
    args = parser.parse_args()
    text = report(run(args.items))
    print(text)
    if args.results:
        args.results.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
