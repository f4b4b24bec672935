"""The console of a run: a live line, routine lines thinned on screen (all kept in train.log),
warnings that stand out and come back at the end; then a real `voicesmith train` in a pipe."""

from __future__ import annotations

import io
import logging
import subprocess
import sys
import time

import pytest

from voicesmith.config import apply_override, preset_dict, validate_config
from voicesmith.training.console import PROGRESS, ROUTINE, Console, format_duration


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def console_logger(console: Console) -> logging.Logger:
    logger = logging.getLogger(f"test_console.{id(console)}")
    logger.handlers[:] = [console]
    logger.setLevel(logging.INFO)
    logger.propagate = False
    return logger


def test_routine_lines_are_thinned_per_kind_and_warnings_always_shown_and_recapped():
    stream, clock = io.StringIO(), Clock()
    console = Console(stream, interactive=False, interval=30, clock=clock)
    log = console_logger(console)
    for epoch in range(10):  # an epoch every 5 s for 50 s
        clock.now = epoch * 5.0
        log.info("Epoch %d: mean loss %.2f", epoch, 1.0 / (epoch + 1), extra=ROUTINE)
        log.info("step %d", epoch * 8, extra=PROGRESS)
        log.info("Wrote samples to %s", f"step_{epoch}", extra=ROUTINE)
    log.warning("Skipped a batch at step %d (nonfinite_loss): items a, b", 12)
    log.warning("Skipped a batch at step %d (nonfinite_loss): items a, b", 12)
    log.info("Validation done.")  # not routine: always shown
    console.close()
    console.close()  # logging closes every handler again at exit: the recap comes once
    lines = stream.getvalue().splitlines()
    epochs = [line for line in lines if line.startswith("Epoch")]
    assert epochs == ["Epoch 0: mean loss 1.00", "Epoch 6: mean loss 0.14"]
    assert [line for line in lines if line.startswith("step")] == ["step 0", "step 48"]  # no live line: thinned too
    assert len([line for line in lines if line.startswith("Wrote")]) == 2
    assert lines.count("WARNING: Skipped a batch at step 12 (nonfinite_loss): items a, b") == 2
    assert "Validation done." in lines
    assert lines[-2:] == ["2 warning(s) during this run (all of them in logs/train.log):",
                          "  2x Skipped a batch at step 12 (nonfinite_loss): items a, b"]
    assert console.thinned == 24


def test_a_terminal_gets_a_live_line_that_log_lines_print_above():
    stream, clock = io.StringIO(), Clock()
    console = Console(stream, interactive=True, clock=clock)
    log = console_logger(console)
    console.set_status("step 1/10 | 2.00 steps/s")
    clock.now = 0.1
    console.set_status("step 2/10 | 2.00 steps/s")  # too soon: remembered, not drawn
    log.info("step 2", extra=PROGRESS)  # the live line shows progress: not printed
    log.warning("Something odd.")
    console.clear_status()
    assert stream.getvalue() == ("\r\x1b[2Kstep 1/10 | 2.00 steps/s"
                                 "\r\x1b[2K\x1b[1;33mWARNING:\x1b[0m Something odd.\nstep 2/10 | 2.00 steps/s"
                                 "\r\x1b[2K")


def test_durations_read_at_a_glance():
    assert [format_duration(s) for s in (0.4, 59, 61, 3599, 7260)] == ["0 s", "59 s", "1 min 1 s", "59 min 59 s",
                                                                       "2 h 1 min"]


@pytest.mark.slow
def test_train_in_a_pipe_prints_a_short_log_and_keeps_every_epoch_in_train_log(demo_corpus, tmp_path):
    raw = preset_dict("tiny", str(demo_corpus))
    for item in ["train.batch_size=4", "data.max_samples=8", "data.num_workers=0", "logging.log_every_n_steps=1",
                 "samples.every_n_steps=0", "samples.on_best=false", "train.val_every_n_steps=1000",
                 "train.checkpoint_every_n_steps=1000"]:
        apply_override(raw, item)
    config = validate_config(raw, source="test")
    config.save(tmp_path / "run" / "config.yaml")
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "voicesmith.cli", "train", str(tmp_path / "run" / "config.yaml"),
                           "--max-steps", "12"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    screen = [line for line in done.stderr.splitlines() if line.startswith("Epoch ")]
    logged = [line for line in (tmp_path / "run" / "logs" / "train.log").read_text().splitlines() if " Epoch " in line]
    assert len(logged) == 6  # 2 steps an epoch
    assert 1 <= len(screen) <= 1 + (time.monotonic() - started) // 30  # on screen, at most one every 30 s
    assert "every one of them is in logs/train.log" in done.stderr
    assert "\r" not in done.stderr  # no live line in a pipe
