"""`voicesmith demo`: the whole path a user takes, on data the project speaks itself.

Corpus -> validation -> tiny acoustic model trained for a few minutes on the
CPU -> samples. Running it again resumes the same run instead of starting over.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional


def run_demo(out: Path, n: int = 120, minutes: float = 6.0, max_steps: Optional[int] = None) -> int:
    from voicesmith.config import init_run
    from voicesmith.demo_corpus import write_demo_corpus
    from voicesmith.training import train_command

    out = Path(out)
    corpus, run_dir = out / "corpus", out / "run"
    if (corpus / "metadata.csv").is_file():
        print(f"[1/3] Using the demo corpus in {corpus}")
    else:
        print(f"[1/3] Speaking a {n}-utterance demo corpus with espeak-ng into {corpus} ...")
        write_demo_corpus(corpus, n=n)
    config_path = run_dir / "config.yaml"
    if not config_path.is_file():
        init_run(corpus, run_dir, model_type="acoustic", preset="tiny",
                 overrides=["samples.every_n_steps=150", "train.val_every_n_steps=50",
                            "train.checkpoint_every_n_steps=50"])
    budget = f"{max_steps} steps" if max_steps else f"{minutes:g} minutes"
    print(f"[2/3] Training the tiny acoustic model for {budget} (run: {run_dir}) ...")
    status = train_command(config_path, resume="auto", max_steps=max_steps,
                           overrides=[] if max_steps else [f"train.max_minutes={minutes}"])
    print(f"[3/3] Done (exit {status}).\n"
          f"  run:         {run_dir}\n"
          f"  samples:     {run_dir / 'samples'}\n"
          f"  report:      {run_dir / 'report.html'} (open it in a browser: curves, samples to listen to)\n"
          f"  summary:     {run_dir / 'summary.json'}\n"
          f"  TensorBoard: tensorboard --logdir {run_dir / 'logs'}\n"
          f"  speak:       voicesmith synth {run_dir} \"Hello from my first voice.\" -o hello.wav\n"
          f"  continue:    voicesmith train {config_path}")
    return status
