"""Speed of the text/audio front end against a peer measured in the same run.

    python benchmarks/bench_mel.py [--seconds 60] [--lines 500] [--threads 1] [--out benchmarks/RESULTS_text_audio.md]

- mel: `audio.mel_spectrogram` (torch) vs the same HiFi-GAN mel through librosa's STFT (needs librosa)
- phonemes: `Phonemizer.phonemize_batch` vs one `phonemize` call per line
- Griffin-Lim: `models.griffin_lim` (32 iterations) vs `librosa.griffinlim` on the same magnitudes (needs librosa)
Times are the best of 3 runs after a warm-up; "x real time" is seconds of audio per second of compute. torch runs on
--threads threads (default 1, like librosa's FFT, so the ratio compares like with like).
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from pathlib import Path

import numpy as np
import torch

from voicesmith.audio import mel_filterbank, mel_spectrogram, stft_padding
from voicesmith.config import AudioConfig
from voicesmith.demo_corpus import demo_sentences
from voicesmith.models.griffin_lim import griffin_lim, mel_to_magnitude
from voicesmith.text import Phonemizer


def best_of(runs: int, function) -> float:
    function()  # warm-up: caches, lazy backends, allocator
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return min(times)


def librosa_mel(audio: np.ndarray, cfg: AudioConfig, librosa) -> np.ndarray:
    left, right = stft_padding(cfg)
    padded = np.pad(audio, (left, right), mode="reflect")
    spectrum = librosa.stft(padded, n_fft=cfg.n_fft, hop_length=cfg.hop_length, win_length=cfg.win_length,
                            center=False)
    magnitude = np.sqrt(np.abs(spectrum) ** 2 + 1e-9)
    return np.log(np.maximum(mel_filterbank(cfg).numpy() @ magnitude, 1e-5))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--lines", type=int, default=500)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "RESULTS_text_audio.md")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    try:
        import librosa
    except ImportError:
        librosa = None

    cfg = AudioConfig()
    rng = np.random.default_rng(0)
    audio = (0.1 * rng.standard_normal(int(args.seconds * cfg.sample_rate))).astype(np.float32)
    rows = []

    ours = best_of(3, lambda: mel_spectrogram(torch.from_numpy(audio), cfg))
    peer = best_of(3, lambda: librosa_mel(audio, cfg, librosa)) if librosa else float("nan")
    rows.append(("mel spectrogram (x real time)", args.seconds / ours, "librosa STFT + same filterbank",
                 args.seconds / peer))

    texts = demo_sentences(args.lines)
    phonemizer = Phonemizer("en-us")
    batch = best_of(3, lambda: phonemizer.phonemize_batch(texts))
    single = best_of(3, lambda: [phonemizer.phonemize(text) for text in texts])
    rows.append(("phonemize_batch (lines/s)", len(texts) / batch, "one phonemize call per line", len(texts) / single))

    gl_seconds = 10.0
    mel = mel_spectrogram(torch.from_numpy(audio[: int(gl_seconds * cfg.sample_rate)]), cfg)
    ours = best_of(3, lambda: griffin_lim(mel, cfg, n_iters=32))
    if librosa:
        magnitude = mel_to_magnitude(mel, cfg).numpy()
        peer = best_of(3, lambda: librosa.griffinlim(magnitude, n_iter=32, hop_length=cfg.hop_length,
                                                     win_length=cfg.win_length, n_fft=cfg.n_fft, momentum=0.99))
    rows.append(("Griffin-Lim, 32 iterations (x real time)", gl_seconds / ours, "librosa.griffinlim, 32 iterations",
                 gl_seconds / peer if librosa else float("nan")))

    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    lines = [f"# Text/audio front end: speed ({platform.processor() or platform.machine()}, "
             f"torch {torch.__version__}, {torch.get_num_threads()} threads)", "",
             f"{os.cpu_count()} CPUs, load average {load:.1f} when measured; ratios compare runs "
             f"made in the same process, one after the other.", "",
             "| measure | voicesmith | peer | peer value | ratio |", "|---|---|---|---|---|"]
    for name, value, peer_name, peer_value in rows:
        lines.append(f"| {name} | {value:.1f} | {peer_name} | {peer_value:.1f} | {value / peer_value:.2f}x |")
    report = "\n".join(lines) + "\n"
    args.out.write_text(report, encoding="utf-8")
    print(report)


if __name__ == "__main__":
    main()
