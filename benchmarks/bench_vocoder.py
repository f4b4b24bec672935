"""Neural vocoder: what it gains over Griffin-Lim, and what each generator costs on this machine.

1. Quality. A demo corpus, the tiny acoustic preset trained for `--acoustic-minutes`, then the
   vocoder stage (`train --stage both`: the tiny Vocos-style vocoder fine-tuned on the acoustic
   model's teacher-forced mels for `--vocoder-steps`). The same acoustic checkpoint is evaluated on
   the held-out validation items (never trained on by either stage) through Griffin-Lim and through
   the vocoder, with `voicesmith eval`'s own scoring: CER/WER (pocketsphinx), MCD, DNSMOS.
2. Speed, per generator preset (tiny, hifigan-v1/v2/v3, vocos): training steps/s of the whole GAN
   step (generator pass, discriminator update, generator update with the preset's discriminator,
   batch 4 x the preset's segment) and inference real-time factor (5 s of mel, one intra-op thread,
   weight norm folded, best of 3). Vocos-style against HiFi-GAN V1 is the ratio the issue asks for.

    python benchmarks/bench_vocoder.py --work /tmp/bench_vocoder --out benchmarks/RESULTS_vocoder.md
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import torch

from voicesmith.config import init_run, load_config, make_config
from voicesmith.demo_corpus import write_demo_corpus
from voicesmith.evaluate import evaluate, validation_items
from voicesmith.inference import Synthesizer, single_threaded_on_cpu
from voicesmith.models import build_model
from voicesmith.training import train
from voicesmith.training.module import loss_weights, weighted_total

PRESETS = ["tiny", "hifigan-v1", "hifigan-v2", "hifigan-v3", "vocos"]
SCORES = ["cer", "wer", "mcd", "dnsmos_ovrl", "rtf"]


def quality(work: Path, n_items: int, acoustic_minutes: float, vocoder_steps: int, eval_items: int,
            stage: str = "both") -> dict:
    """`stage` "vocoder" continues the vocoder stage of an earlier benchmark run up to `vocoder_steps`."""
    corpus, run = work / "corpus", work / "run"
    if not (corpus / "metadata.csv").is_file():
        write_demo_corpus(corpus, n=n_items)
    if not (run / "config.yaml").is_file():
        init_run(corpus, run, "acoustic", "tiny", overrides=[
            "data.num_workers=0", "data.val_fraction=0.1", "samples.every_n_steps=0", "samples.on_best=false",
            "train.val_every_n_steps=100", "train.checkpoint_every_n_steps=100",
            f"train.max_minutes={acoustic_minutes}", "train.max_steps=100000"])
    config = load_config(run / "config.yaml", [f"train.stage2.max_steps={vocoder_steps}",
                                               "train.stage2.batch_size=8"])
    started = time.perf_counter()
    summary = train(config, stage=stage)
    seconds = time.perf_counter() - started
    griffin_lim = Synthesizer.load(run, vocoder="griffin-lim")
    vocoder = Synthesizer.load(run)
    items = validation_items(griffin_lim.config, griffin_lim.symbols)[:eval_items]
    references: dict = {}
    results = {name: evaluate(synth, items, references=references)
               for name, synth in (("griffin_lim", griffin_lim), ("vocoder", vocoder))}
    stages = summary["stages"]
    return {"train_seconds": round(seconds, 1), "n_eval_items": len(items),
            "acoustic_steps": stages["acoustic"]["global_step"], "vocoder_steps": stages["vocoder"]["global_step"],
            "vocoder_last_losses": stages["vocoder"]["last_losses"],
            "reference": {key: results["vocoder"].get(f"reference_{key}") for key in ("cer", "wer", "dnsmos_ovrl")},
            **{name: {key: result.get(key) for key in SCORES} for name, result in results.items()}}


def training_speed(preset: str, steps: int, batch_size: int = 4, generator_only: bool = False) -> float:
    """Steps per second of the whole GAN step (generator pass, discriminator update, generator update, as
    the engine does), or with `generator_only` of the generator's own part (pass, mel loss, update) at
    32 frames for every preset: the generators compared on equal terms."""
    config = make_config("corpus", preset, "vocoder")
    torch.manual_seed(0)
    model = build_model(config.model, 1, config.audio.n_mels, audio_cfg=config.audio).train()
    weights = loss_weights(model, config)
    opt_g = torch.optim.AdamW(model.generator_parameters(), lr=2e-4)
    opt_d = torch.optim.AdamW(model.discriminator_parameters(), lr=2e-4)
    frames = 32 if generator_only else config.model.vocoder_segment_frames
    model.segment_frames = frames
    batch = {"mels": torch.randn(batch_size, config.audio.n_mels, frames) - 5,
             "mel_lengths": torch.full((batch_size,), frames),
             "audio": torch.randn(batch_size, frames * config.audio.hop_length) * 0.1}

    def gan_step() -> None:
        output = model(batch)
        opt_d.zero_grad()
        weighted_total(model.discriminator_losses(batch, output), weights).backward()
        opt_d.step()
        opt_g.zero_grad()
        weighted_total(model.generator_losses(batch, output), weights).backward()
        opt_g.step()

    def generator_step() -> None:
        opt_g.zero_grad()
        model.mel_loss(model(batch)).backward()
        opt_g.step()

    step = generator_step if generator_only else gan_step
    step()  # warm-up, untimed
    started = time.perf_counter()
    for _ in range(steps):
        step()
    return steps / (time.perf_counter() - started)


def inference_rtf(preset: str, seconds: float = 5.0, repeats: int = 3) -> float:
    config = make_config("corpus", preset, "vocoder")
    from voicesmith.models.vocoder import build_generator

    generator = build_generator(config.model, config.audio).eval()
    generator.remove_weight_norm()
    frames = round(seconds * config.audio.sample_rate / config.audio.hop_length)
    mel = torch.randn(1, config.audio.n_mels, frames) - 5
    best = float("inf")
    with torch.no_grad(), single_threaded_on_cpu(torch.device("cpu")):
        generator(mel[..., :20])  # warm-up
        for _ in range(repeats):
            started = time.perf_counter()
            generator(mel)
            best = min(best, time.perf_counter() - started)
    return best / (frames * config.audio.hop_length / config.audio.sample_rate)


def speed(steps: int) -> dict:
    rows = {}
    for preset in PRESETS:
        rows[preset] = {"train_steps_per_s": round(training_speed(preset, steps), 3),
                        "generator_steps_per_s": round(training_speed(preset, steps * 2, generator_only=True), 3),
                        "inference_rtf": round(inference_rtf(preset), 5)}
        print(preset, rows[preset], flush=True)
    return rows


def markdown(result: dict) -> str:
    lines = [f"Machine: {platform.machine()}, {os.cpu_count()} CPU cores, no GPU; load average at the end "
             f"{os.getloadavg()[0]:.1f} (shared with other jobs). torch {torch.__version__}.", ""]
    q = result.get("quality")
    if q:
        lines += ["## Griffin-Lim against the fine-tuned vocoder, same acoustic checkpoint", "",
                  f"Tiny acoustic model ({q['acoustic_steps']} steps), then the tiny vocoder fine-tuned for "
                  f"{q['vocoder_steps']} steps on its teacher-forced mels ({q['train_seconds']:.0f} s for both "
                  f"stages). {q['n_eval_items']} held-out validation items.", "",
                  "| vocoder | CER | WER | MCD (dB) | DNSMOS OVRL | RTF |", "|---|---|---|---|---|---|"]
        for name in ("griffin_lim", "vocoder"):
            row = q[name]
            lines.append(f"| {name.replace('_', '-')} | " + " | ".join(_cell(row.get(key)) for key in SCORES) + " |")
        ref = q["reference"]
        lines += [f"| the recordings themselves | {_cell(ref['cer'])} | {_cell(ref['wer'])} | | "
                  f"{_cell(ref['dnsmos_ovrl'])} | |", ""]
    s = result.get("speed")
    if s:
        lines += ["## Speed per generator (CPU)", "",
                  "| preset | GAN steps/s, preset as configured (batch 4) | generator steps/s (batch 4 x 32 frames, "
                  "mel loss) | inference RTF (5 s of mel, 1 thread) |", "|---|---|---|---|"]
        lines += [f"| {preset} | {row['train_steps_per_s']:.3f} | {row['generator_steps_per_s']:.3f} | "
                  f"{row['inference_rtf']:.4f} |" for preset, row in s.items()]
        v1, vocos = s["hifigan-v1"], s["vocos"]
        lines += ["", f"Vocos-style against HiFi-GAN V1, same run: inference "
                      f"**{v1['inference_rtf'] / vocos['inference_rtf']:.1f}x faster**; the generator's training "
                      f"step {vocos['generator_steps_per_s'] / v1['generator_steps_per_s']:.1f}x faster; the whole "
                      f"GAN step {vocos['train_steps_per_s'] / v1['train_steps_per_s']:.1f}x (the vocos preset adds "
                      f"the multi-resolution discriminator and trains on 64-frame windows).", ""]
    return "\n".join(lines)


def _cell(value) -> str:
    return "" if value is None else f"{value:.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, default=Path("/tmp/bench_vocoder"))
    parser.add_argument("--out", type=Path, help="write the markdown here (and the raw numbers beside it, .json)")
    parser.add_argument("--items", type=int, default=120, help="utterances in the demo corpus")
    parser.add_argument("--acoustic-minutes", type=float, default=10.0)
    parser.add_argument("--vocoder-steps", type=int, default=500)
    parser.add_argument("--eval-items", type=int, default=12)
    parser.add_argument("--stage", choices=["both", "vocoder"], default="both",
                        help="vocoder: continue the vocoder stage of the run in --work (more --vocoder-steps)")
    parser.add_argument("--speed-steps", type=int, default=2)
    parser.add_argument("--skip", choices=["quality", "speed"], action="append", default=[])
    args = parser.parse_args()
    torch.set_num_threads(1)  # a shared 2-core machine: more threads only wait for each other
    result = {}
    if "speed" not in args.skip:
        result["speed"] = speed(args.speed_steps)
    if "quality" not in args.skip:
        result["quality"] = quality(args.work, args.items, args.acoustic_minutes, args.vocoder_steps,
                                    args.eval_items, args.stage)
    text = markdown(result)
    print(text)
    if args.out:
        args.out.write_text("# Vocoder benchmark\n\n" + text, encoding="utf-8")
        args.out.with_suffix(".json").write_text(json.dumps(result, indent=2), encoding="utf-8")


if __name__ == "__main__":
    main()
