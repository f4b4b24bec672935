"""Engine overhead and data wait on the tiny preset, measured in one process on the same data.

1. Overhead: time per training step of the full engine (`voicesmith.training.train`: manual step with
   finite checks and clipping, skip guard, loss watch, TensorBoard + CSV logging, loss table, progress
   lines, checkpoint cadence) against bare Lightning (automatic optimisation, `gradient_clip_val`, no
   logger, no callbacks, no checkpoints) on the same model, the same batches and the same number of
   steps. The machine this runs on is shared, so wall time drifts with other people's load: the
   comparison uses the process's CPU time per step with one torch thread and no loader workers (all
   work in this process, none of it waiting), over alternating runs (bare, engine, bare, engine, ...),
   median of the per-pair ratios. Wall times are reported next to them.
2. Data wait: the share of the loop spent waiting for batches with the default loader settings
   (data.num_workers=2, two torch threads), from the engine's own profiler (logging.profile).
3. Memory monitor: the time the memory callback takes, as a share of the loop (logging.memory).

    python benchmarks/bench_engine.py --out benchmarks/RESULTS_engine.md
"""

from __future__ import annotations

import argparse
import platform
import statistics
import tempfile
import time
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback

from voicesmith.config import VoiceConfig, apply_override, preset_dict, validate_config
from voicesmith.demo_corpus import write_demo_corpus
from voicesmith.models import build_model
from voicesmith.training import train
from voicesmith.training.datamodule import VoiceDataModule
from voicesmith.training.module import loss_weights, weighted_total


class LoopTimer(Callback):
    """Wall and process CPU time from the start of step `warmup` to the end of training, per step."""

    def __init__(self, warmup: int):
        self.warmup, self.started = warmup, None
        self.wall = self.cpu = float("nan")

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step == self.warmup and self.started is None:
            self.started = (time.perf_counter(), time.process_time())

    def on_train_end(self, trainer, pl_module) -> None:
        steps = trainer.global_step - self.warmup
        self.wall = (time.perf_counter() - self.started[0]) / steps
        self.cpu = (time.process_time() - self.started[1]) / steps


class BareModule(L.LightningModule):
    """The same model trained the plain Lightning way."""

    def __init__(self, config: VoiceConfig):
        super().__init__()
        self.config, self.model = config, None

    def configure_model(self) -> None:
        datamodule = self.trainer.datamodule
        self.model = build_model(self.config.model, len(datamodule.symbols), self.config.audio.n_mels,
                                 max(1, len(datamodule.speakers)))
        self.model.set_mel_stats(*datamodule.mel_stats())
        self.weights = loss_weights(self.model, self.config)

    def training_step(self, batch, batch_idx):
        return weighted_total(self.model(batch).losses, self.weights)

    def configure_optimizers(self):
        train_cfg = self.config.train
        return torch.optim.AdamW(self.model.parameters(), lr=train_cfg.learning_rate, betas=tuple(train_cfg.betas))


def make_config(corpus: Path, run_dir: Path, *overrides: str) -> VoiceConfig:
    raw = preset_dict("tiny", str(corpus))
    for item in ["samples.every_n_steps=0", "samples.on_best=false", "logging.progress_bar=false",
                 "train.val_every_n_steps=100000", f"data.cache_dir={run_dir.parent / 'cache'}", *overrides]:
        apply_override(raw, item)
    config = validate_config(raw, source="benchmark")
    config.save(run_dir / "config.yaml")
    return config


def run_bare(config: VoiceConfig, steps: int, warmup: int) -> LoopTimer:
    L.seed_everything(config.train.seed, verbose=False)
    timer = LoopTimer(warmup)
    trainer = L.Trainer(accelerator="cpu", devices=1, max_steps=steps, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, callbacks=[timer],
                        gradient_clip_val=config.train.grad_clip_norm, num_sanity_val_steps=0, limit_val_batches=0,
                        use_distributed_sampler=False)
    trainer.fit(BareModule(config), datamodule=VoiceDataModule(config))
    return timer


def run_engine(config: VoiceConfig, steps: int, warmup: int) -> tuple[LoopTimer, dict]:
    timer = LoopTimer(warmup)
    summary = train(config, resume="never", max_steps=steps, callbacks=[timer])
    return timer, summary


NOTES = """Notes:
- The spread between pairs is the machine's own noise (a shared 2-core VM; other jobs start and stop);
  read the median. Per-step engine work (finite-loss check, guard, loss watch, logging calls) is small
  next to a tiny-model step of ~0.4 s; the checkpoint cadence is the only cost that grows, with the
  checkpoint size (each save is written to a temporary file, fsynced and renamed).
- "Checkpoint every 10 steps" is ten times the tiny preset's cadence: an upper bound, not the default.
- Data wait is measured by the engine's profiler (time in `next()` on the train loader); on a tiny corpus
  every epoch restarts the loader, so the share falls further on real corpora (hundreds of batches per epoch).
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=25, help="timed steps per run (after the warmup)")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--pairs", type=int, default=4, help="alternating bare/engine runs")
    parser.add_argument("--items", type=int, default=200, help="demo corpus size")
    parser.add_argument("--out", type=Path, help="write the results table (markdown) here")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench_engine_"))
    corpus = write_demo_corpus(work / "corpus", n=args.items)
    total = args.steps + args.warmup
    in_process = ["data.num_workers=0"]

    torch.set_num_threads(1)
    bare, engine = [], []
    for pair in range(args.pairs):
        bare.append(run_bare(make_config(corpus, work / f"bare{pair}", *in_process), total, args.warmup))
        engine.append(run_engine(make_config(corpus, work / f"engine{pair}", *in_process), total, args.warmup)[0])
    busy = ["train.checkpoint_every_n_steps=10", "logging.log_every_n_steps=1"]
    busy_bare = run_bare(make_config(corpus, work / "bare_busy", *in_process), total, args.warmup)
    busy_engine = run_engine(make_config(corpus, work / "engine_busy", *in_process, *busy), total, args.warmup)[0]

    torch.set_num_threads(2)
    monitored = make_config(corpus, work / "profiled", "logging.profile=true", "logging.memory=true")
    profiled, summary = run_engine(monitored, total, args.warmup)
    perf, memory = summary["perf"], summary["memory"]
    loop_seconds = profiled.wall * (total - args.warmup)

    ratios = [e.cpu / b.cpu for b, e in zip(bare, engine)]
    ms = lambda timers, kind: 1000 * statistics.median(getattr(t, kind) for t in timers)  # noqa: E731
    batch_size = preset_dict("tiny", "")["train"]["batch_size"]
    rows = [
        ("bare Lightning (automatic optimisation, no logger/callbacks/checkpoints)",
         f"{ms(bare, 'cpu'):.1f}", f"{ms(bare, 'wall'):.1f}", "1.000"),
        ("voicesmith engine, tiny preset cadence (log every 10 steps, checkpoint every 100)",
         f"{ms(engine, 'cpu'):.1f}", f"{ms(engine, 'wall'):.1f}",
         f"{statistics.median(ratios):.3f} (pairs: {', '.join(f'{r:.3f}' for r in ratios)})"),
        ("voicesmith engine, log every step + checkpoint every 10 steps (vs. a bare run next to it)",
         f"{1000 * busy_engine.cpu:.1f}", f"{1000 * busy_engine.wall:.1f}", f"{busy_engine.cpu / busy_bare.cpu:.3f}"),
    ]
    lines = ["# Training engine benchmark", "",
             f"Tiny preset acoustic model, demo corpus of {args.items} items, batch {batch_size}, "
             f"{platform.machine()} CPU, {args.steps} timed steps after {args.warmup} warmup steps, all runs in one "
             f"process on the same batches (`python benchmarks/bench_engine.py`).", "",
             "## Engine overhead (target: under 3 %)", "",
             "One torch thread, no loader workers; ratio = engine CPU time per step / bare CPU time per step, "
             f"median over {args.pairs} alternating pairs.", "",
             "| run | CPU ms/step | wall ms/step | ratio to bare |", "|---|---|---|---|",
             *[f"| {name} | {cpu} | {wall} | {ratio} |" for name, cpu, wall, ratio in rows], "",
             "## Data wait and monitors (default loader: 2 workers, 2 torch threads)", "",
             "| measurement | value |", "|---|---|",
             f"| data wait share of the loop (target: under 5 %) | {100 * perf['data_wait_fraction']:.1f} % |",
             f"| step phases | forward {1000 * perf['forward_s']:.1f} ms, backward {1000 * perf['backward_s']:.1f} ms, "
             f"optimizer {1000 * perf['optimizer_s']:.1f} ms, data wait {1000 * perf['data_wait_s']:.1f} ms |",
             f"| throughput | {perf['samples_per_s']:.1f} samples/s, {perf['frames_per_s']:.0f} frames/s, "
             f"padding {100 * perf['padding_fraction']:.1f} % |",
             f"| memory monitor time, share of the loop (every 10 steps) | "
             f"{100 * memory['monitor_seconds'] / loop_seconds:.3f} % |", "", NOTES]
    text = "\n".join(lines)
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
