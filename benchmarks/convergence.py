"""Convergence of the tiny acoustic preset: validation mel loss against wall time, through the real engine.

Makes a demo corpus (300 utterances by default), `init`s a tiny run and trains it with
`voicesmith.training.train` on this machine's CPU for at most `--minutes` (train.max_minutes) or
the preset's max_steps, whichever ends first, validating every `--val-every` steps. Writes:

- `convergence.png`: validation mel loss (normalised units, as logged) against minutes of training;
- `convergence_alignment.png`: for one validation item, the MAS alignment, the recording's mel, the
  teacher-forced mel and the mel the model speaks from the text alone (predicted durations);
- `RESULTS_convergence.md`: the curve as a table, the final numbers and `voicesmith eval`'s scores
  (ASR character/word error rates against those of the recordings, MCD, duration ratio).

    python benchmarks/convergence.py --minutes 15            # the README figure (15 minutes)
    python benchmarks/convergence.py --minutes 1 --items 40  # smoke test
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402
from lightning.pytorch.callbacks import Callback  # noqa: E402

from voicesmith.checkpoint import load_checkpoint, model_state  # noqa: E402
from voicesmith.config import init_run, load_config  # noqa: E402
from voicesmith.data.cache import FeatureCache  # noqa: E402
from voicesmith.data.loader import TTSDataset, collate_batch, split_entries  # noqa: E402
from voicesmith.demo_corpus import write_demo_corpus  # noqa: E402
from voicesmith.evaluate import evaluate, validation_items  # noqa: E402
from voicesmith.inference import Synthesizer  # noqa: E402
from voicesmith.models import build_model  # noqa: E402
from voicesmith.training import train  # noqa: E402


class ValidationCurve(Callback):
    """(minutes since the first training step, step, validation mel loss, validation total) at each validation."""

    def __init__(self):
        self.start: float | None = None
        self.points: list[tuple[float, int, float, float]] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if self.start is None:
            self.start = time.perf_counter()

    def on_validation_end(self, trainer, pl_module) -> None:
        metrics = trainer.callback_metrics
        if self.start is None or "val/mel" not in metrics:
            return
        self.points.append(((time.perf_counter() - self.start) / 60, trainer.global_step,
                            float(metrics["val/mel"]), float(metrics["val_loss"])))
        print(f"  {self.points[-1][0]:5.1f} min  step {trainer.global_step:5d}  val mel {self.points[-1][2]:.4f}",
              flush=True)


def plot_curve(points: list[tuple[float, int, float, float]], path: Path, title: str) -> None:
    minutes, _, mel, _ = zip(*points)
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(minutes, mel, marker="o", markersize=3)
    ax.set_xlabel("minutes of training")
    ax.set_ylabel("validation mel loss (L1, normalised mel)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_alignment(run_dir: Path, path: Path) -> dict:
    """Teacher-forced alignment and mels, and free synthesis, for the first validation item."""
    config = load_config(run_dir / "config.yaml")
    cache = FeatureCache.load(config.resolve(config.data.cache_dir))
    ckpt = load_checkpoint(run_dir / "checkpoints" / "last.ckpt")
    model = build_model(config.model, len(cache.symbols), config.audio.n_mels, cache.n_speakers, config.resolve)
    model.load_state_dict(model_state(ckpt))
    model.eval()
    _, val_indices = split_entries(cache.entries, config.data.val_fraction, config.data.val_max_items, config.data.seed)
    dataset = TTSDataset(cache.root, [cache.entries[val_indices[0]]], config.audio.hop_length)
    batch = collate_batch([dataset[0]])
    with torch.no_grad():
        forced = model(batch)
        free = model.infer(batch["phoneme_ids"], batch["phoneme_lengths"], batch["speaker_ids"])
    panels = [("MAS alignment (phoneme ids x frames)", forced.alignment[0]), ("recording", batch["mels"][0]),
              ("teacher-forced (MAS durations)", forced.mel[0]),
              ("from text alone (predicted durations)", free["mel"][0])]
    fig, axes = plt.subplots(len(panels), 1, figsize=(10, 11))
    for ax, (name, image) in zip(axes, panels):
        ax.imshow(image.numpy(), aspect="auto", origin="lower", interpolation="none")
        ax.set_title(name, fontsize=10)
    fig.suptitle(f"\"{batch['texts'][0]}\" — step {ckpt['voicesmith']['global_step']}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return {"recorded_frames": int(batch["mel_lengths"][0]), "predicted_frames": int(free["mel_lengths"][0])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=15.0)
    parser.add_argument("--items", type=int, default=300)
    parser.add_argument("--val-every", type=int, default=100, help="validate every N steps (the preset's)")
    parser.add_argument("--eval-items", type=int, default=8, help="validation items scored by `voicesmith eval`")
    parser.add_argument("--out-dir", type=Path, default=Path(__file__).resolve().parent)
    parser.add_argument("--work-dir", type=Path, help="keep the corpus and run here (default: a temporary folder)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = args.work_dir or Path(tmp)
        corpus = write_demo_corpus(work / "corpus", n=args.items)
        run_dir = work / "run"
        overrides = [f"train.max_minutes={args.minutes}",  # the preset's max_steps (its LR schedule) stays
                     f"train.val_every_n_steps={args.val_every}", "train.checkpoint_every_n_steps=1000000",
                     "samples.every_n_steps=0", "samples.on_best=false", "logging.progress_bar=false",
                     *args.overrides]
        init_run(corpus, run_dir, "acoustic", "tiny", overrides, force=True)
        config = load_config(run_dir / "config.yaml")
        curve = ValidationCurve()
        summary = train(config, resume="never", callbacks=[curve])
        args.out_dir.mkdir(parents=True, exist_ok=True)
        machine = f"{platform.machine()}, {os.cpu_count()} cores, {torch.get_num_threads()} torch threads"
        plot_curve(curve.points, args.out_dir / "convergence.png",
                   f"tiny preset, {args.items}-utterance demo corpus, {machine}")
        lengths = plot_alignment(run_dir, args.out_dir / "convergence_alignment.png")
        scores = evaluate(Synthesizer.load(run_dir), validation_items(config), limit=args.eval_items)
        write_results(args, summary, curve.points, lengths, scores, machine)


def write_results(args, summary: dict, points: list, lengths: dict, scores: dict, machine: str) -> None:
    final_minutes, final_step, final_mel, final_total = points[-1]
    lines = ["# Acoustic model: convergence of the tiny preset", "",
             f"`python benchmarks/convergence.py --minutes {args.minutes:g} --items {args.items}` — {machine}, "
             f"load average at the end {os.getloadavg()[0]:.1f}. The real engine (`voicesmith.training.train`), "
             f"the tiny preset's settings, validation every {args.val_every} steps.", "",
             f"After {final_minutes:.1f} minutes ({final_step} steps): validation mel loss **{final_mel:.4f}** "
             f"(first validation: {points[0][2]:.4f} at step {points[0][1]}); validation total {final_total:.4f}. "
             f"Run status: {summary['status']} ({summary['reason']}).", "",
             f"Duration check on the pictured validation item: recording {lengths['recorded_frames']} frames, "
             f"spoken from text {lengths['predicted_frames']} frames "
             f"({lengths['predicted_frames'] / lengths['recorded_frames']:.2f}x).", "",
             f"`voicesmith eval` on {scores['n_items']} validation items (Griffin-Lim, {scores.get('recognizer')}): "
             f"CER {_score(scores, 'cer')} (the recordings themselves: {_score(scores, 'reference_cer')}), "
             f"WER {_score(scores, 'wer')} (recordings: {_score(scores, 'reference_wer')}), MCD "
             f"{_score(scores, 'mcd')} dB, duration ratio {_score(scores, 'duration_ratio')}, "
             f"RTF {_score(scores, 'rtf')}.",
             "",
             "![validation mel loss](convergence.png)", "", "![alignment and mels](convergence_alignment.png)", "",
             "| minutes | step | val mel | val total |", "|---|---|---|---|"]
    lines += [f"| {minutes:.1f} | {step} | {mel:.4f} | {total:.4f} |" for minutes, step, mel, total in points]
    text = "\n".join(lines) + "\n"
    (args.out_dir / "RESULTS_convergence.md").write_text(text, encoding="utf-8")
    print(text)


def _score(scores: dict, key: str) -> str:
    value = scores.get(key)
    return "n/a" if value is None else f"{value:.3f}"


if __name__ == "__main__":
    main()
