"""Acoustic model speed: training throughput (mel frames/s) and inference real-time factor.

1. Training throughput of the tiny and small presets: one optimizer step (forward with MAS, backward,
   gradient clipping, AdamW) on real batches from a demo corpus, made by the project's own feature
   cache and length-bucketed loader; batches are loaded before the clock starts, so only the model
   is timed. Reported as valid mel frames per second and as seconds of speech trained per second
   (the ratio against real time). On CUDA, 32-bit and bf16-mixed are measured side by side.
2. Inference real-time factor (compute seconds per second of audio) of the model and of Griffin-Lim,
   per sentence, as `voicesmith synth` runs them (one intra-op thread on the CPU, see
   `inference.single_threaded_on_cpu`). The models are untrained, so their duration
   predictor's output bias is set to the corpus's mean log frames per phoneme id: the audio then
   has realistic length, which is what the per-second figure needs.

    python benchmarks/bench_acoustic.py --items 64 --steps 8 --out benchmarks/RESULTS_acoustic.md
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path

import torch

from voicesmith.config import VoiceConfig, apply_override, preset_dict, validate_config
from voicesmith.data.cache import prepare
from voicesmith.data.loader import build_dataloaders
from voicesmith.demo_corpus import write_demo_corpus
from voicesmith.inference import single_threaded_on_cpu
from voicesmith.models import build_model
from voicesmith.models.acoustic import mel_statistics
from voicesmith.models.griffin_lim import griffin_lim
from voicesmith.text import TextFrontend
from voicesmith.training.module import loss_weights, weighted_total

SENTENCES = ["The quick brown fox jumps over the lazy dog.",
             "Every voice tells a story of its own, and this one is still learning to speak.",
             "Why did the old sailor carry a basket of apples to the harbour on Sunday?"]


def make_config(corpus: Path, work: Path, preset: str) -> VoiceConfig:
    raw = preset_dict(preset, str(corpus))
    for item in [f"data.cache_dir={work / 'cache'}", "data.num_workers=0", "data.val_fraction=0.1"]:
        apply_override(raw, item)
    config = validate_config(raw, source="benchmark")
    config.save(work / preset / "config.yaml")
    return config


def load_batches(config: VoiceConfig, n_batches: int) -> tuple[list[dict], object]:
    cache = prepare(config, progress=False)
    train_loader, _ = build_dataloaders(config, cache)
    batches = []
    while len(batches) < n_batches:
        batches.extend(train_loader)
    return batches[:n_batches], cache


def training_throughput(config: VoiceConfig, batches: list[dict], cache, device: str, precision: str,
                        warmup: int) -> dict:
    """Frames/s over the timed steps (after `warmup` steps): all their frames over all their time."""
    torch.manual_seed(0)
    model = build_model(config.model, len(cache.symbols), config.audio.n_mels, max(1, len(cache.speakers)))
    stats_batch = batches[0]
    model.set_mel_stats(*mel_statistics(stats_batch["mels"], stats_batch["mel_lengths"]))
    model.to(device).train()
    weights = loss_weights(model, config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.train.learning_rate, betas=config.train.betas)
    autocast = (torch.autocast(device_type=device, dtype=torch.bfloat16) if precision == "bf16-mixed"
                else nullcontext())
    steps, frames_total, seconds_total = 0, 0, 0.0
    for step, batch in enumerate(batches):
        batch = {key: value.to(device) if torch.is_tensor(value) else value for key, value in batch.items()}
        synchronize(device)
        start = time.perf_counter()
        with autocast:
            loss = weighted_total(model(batch).losses, weights)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.train.grad_clip_norm or 1.0)
        optimizer.step()
        synchronize(device)
        elapsed = time.perf_counter() - start
        if step >= warmup:
            steps, frames_total, seconds_total = steps + 1, frames_total + int(batch["mel_lengths"].sum()), \
                seconds_total + elapsed
    frames_per_second = frames_total / seconds_total
    audio_per_frame = config.audio.hop_length / config.audio.sample_rate
    return {"params": sum(p.numel() for p in model.parameters()), "frames_per_second": frames_per_second,
            "realtime": frames_per_second * audio_per_frame, "steps": steps,
            "frames_per_batch": frames_total / steps, "seconds_per_step": seconds_total / steps}


def inference_speed(config: VoiceConfig, cache, device: str, gl_iters: list[int], repeats: int) -> dict:
    with single_threaded_on_cpu(torch.device(device)):  # as the Synthesizer runs
        return _inference_speed(config, cache, device, gl_iters, repeats)


def _inference_speed(config: VoiceConfig, cache, device: str, gl_iters: list[int], repeats: int) -> dict:
    torch.manual_seed(0)
    model = build_model(config.model, len(cache.symbols), config.audio.n_mels, max(1, len(cache.speakers)))
    frames = sum(entry["n_frames"] for entry in cache.entries)
    tokens = sum(entry["n_ids"] for entry in cache.entries)
    with torch.no_grad():  # realistic lengths from an untrained model (see the module docstring)
        model.duration_predictor.out.bias.fill_(math.log(frames / tokens))
    model.to(device).eval()
    frontend = TextFrontend(config.text, cache.symbols)
    encoded = [torch.tensor([item.ids], device=device) for item in frontend.encode_batch(SENTENCES)]
    model_seconds, audio_seconds, mels = 0.0, 0.0, []
    with torch.no_grad():
        for _ in range(repeats + 1):
            for index, ids in enumerate(encoded):
                synchronize(device)
                start = time.perf_counter()
                output = model.infer(ids, torch.tensor([ids.shape[1]], device=device))
                synchronize(device)
                if _ > 0:  # the first round warms up
                    model_seconds += time.perf_counter() - start
                    audio_seconds += int(output["mel_lengths"][0]) * config.audio.hop_length / config.audio.sample_rate
                else:
                    mels.append(output["mel"][0])
    result = {"model_rtf": model_seconds / audio_seconds, "audio_seconds": audio_seconds / repeats}
    for n_iters in gl_iters:
        griffin_lim(mels[0], config.audio, n_iters=n_iters)  # warm-up
        synchronize(device)
        start = time.perf_counter()
        for _ in range(repeats):
            for mel in mels:
                griffin_lim(mel, config.audio, n_iters=n_iters)
        synchronize(device)
        result[f"gl{n_iters}_rtf"] = (time.perf_counter() - start) / audio_seconds
    return result


def synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def report(args, rows: list[dict], inference: list[dict]) -> str:
    lines = ["# Acoustic model: speed", "",
             f"`python benchmarks/bench_acoustic.py --items {args.items} --steps {args.steps}` — {machine()}.", "",
             "## Training throughput", "",
             f"One optimizer step per batch (MAS, forward, backward, clipping, AdamW), batch size of the preset, "
             f"length-bucketed batches of a {args.items}-utterance demo corpus; valid mel frames of {args.steps} steps "
             f"(after {args.warmup} warm-up steps) over their time. x real time: seconds of speech trained per "
             f"second.", "",
             "| preset | parameters | device | precision | threads | mel frames/s | x real time | s/step "
             "| frames/batch | vs tiny (same setting) | vs first setting (same preset) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        tiny = next(r for r in rows if r["preset"] == "tiny" and r["setting"] == row["setting"])
        first = next(r for r in rows if r["preset"] == row["preset"])
        lines.append(f"| {row['preset']} | {row['params'] / 1e6:.2f} M | {row['device']} | {row['precision']} | "
                     f"{row['threads']} | {row['frames_per_second']:.0f} | {row['realtime']:.1f}x | "
                     f"{row['seconds_per_step']:.2f} | {row['frames_per_batch']:.0f} | "
                     f"{row['frames_per_second'] / tiny['frames_per_second']:.2f}x | "
                     f"{row['frames_per_second'] / first['frames_per_second']:.2f}x |")
    lines += ["", "## Inference real-time factor", "",
              "Compute seconds per second of audio (lower is faster; below 1 is faster than real time), "
              f"{len(SENTENCES)} sentences one at a time as `voicesmith synth` speaks them, {args.repeats} rounds "
              "after one warm-up round.", "",
              "| preset | device | model RTF | " + " | ".join(f"Griffin-Lim {n} it. RTF" for n in args.gl_iters)
              + " | " + " | ".join(f"total ({n} it.) RTF | x faster than real time" for n in args.gl_iters) + " |",
              "|---|---|---|" + "---|" * len(args.gl_iters) + "---|---|" * len(args.gl_iters)]
    for row in inference:
        gl = " | ".join(f"{row[f'gl{n}_rtf']:.4f}" for n in args.gl_iters)
        totals = " | ".join(f"{total:.4f} | {1 / total:.0f}x"
                            for total in (row["model_rtf"] + row[f"gl{n}_rtf"] for n in args.gl_iters))
        lines.append(f"| {row['preset']} | {row['device']} | {row['model_rtf']:.4f} | {gl} | {totals} |")
    lines += ["", f"Load average at the end: {os.getloadavg()[0]:.1f}. On a shared machine the numbers vary "
              f"several-fold between runs (other processes take cores; multi-threaded torch then waits for "
              f"descheduled threads), "
              f"so compare rows of one run. Convergence (validation mel loss over 15 minutes, alignment "
              f"picture): RESULTS_convergence.md from benchmarks/convergence.py."]
    return "\n".join(lines) + "\n"


def machine() -> str:
    gpu = f", {torch.cuda.get_device_name()}" if torch.cuda.is_available() else ""
    return (f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, "
            f"{torch.get_num_threads()} threads{gpu}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--items", type=int, default=64)
    parser.add_argument("--steps", type=int, default=8, help="timed steps per measurement")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3, help="inference rounds")
    parser.add_argument("--presets", nargs="+", default=["tiny", "small"])
    parser.add_argument("--gl-iters", nargs="+", type=int, default=[16, 32])
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    cpu_threads = torch.get_num_threads()
    # CPU with all threads and with one (on a busy machine one thread can be faster); CUDA in 32 and bf16-mixed
    settings = [("cpu", "32", n) for n in dict.fromkeys([cpu_threads, 1])]
    if torch.cuda.is_available():
        settings += [("cuda", "32", cpu_threads), ("cuda", "bf16-mixed", cpu_threads)]
    rows, inference = [], []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        corpus = write_demo_corpus(work / "corpus", n=args.items)
        for preset in args.presets:
            config = make_config(corpus, work, preset)
            batches, cache = load_batches(config, args.warmup + args.steps)
            for device, precision, threads in settings:
                torch.set_num_threads(threads)
                row = training_throughput(config, batches, cache, device, precision, args.warmup)
                rows.append({"preset": preset, "device": device, "precision": precision, "threads": threads,
                             "setting": (device, precision, threads), **row})
                print(rows[-1], flush=True)
            torch.set_num_threads(cpu_threads)
            for device in devices:
                inference.append({"preset": preset, "device": device,
                                  **inference_speed(config, cache, device, args.gl_iters, args.repeats)})
                print(inference[-1], flush=True)
    text = report(args, rows, inference)
    print(text)
    if args.out:
        args.out.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
