"""kill -9 at seeded random moments and half-way through checkpoint writes; SIGTERM and Ctrl-C.

After every kill: last.ckpt is readable whenever it exists, `--resume auto` succeeds, loses at most
one checkpoint interval of the steps the killed process had reached, takes over the dead process's
lock and clears its temporary files. SIGTERM and Ctrl-C leave last.ckpt and summary.json.
"""

from __future__ import annotations

import logging
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from reliability_helpers import read_summary

from voicesmith.checkpoint import load_checkpoint
from voicesmith.config import load_config
from voicesmith.training import train

CHILD = Path(__file__).with_name("train_child.py")
INTERVAL = 2  # train.checkpoint_every_n_steps in the trials
MAX_STEPS = 400  # never reached: every child is killed first
STEP_MARK = re.compile(r"trained step (\d+)")  # what train_child.py prints after each step


def start_child(config, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(CHILD), str(config.path), str(MAX_STEPS), *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def wait_for_steps(child: subprocess.Popen, n: int, timeout: float = 240) -> list[str]:
    """Read the child's output until it has printed `trained step n` (or died)."""
    lines, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = child.stdout.readline()
        if not line:
            break
        lines.append(line)
        if n in steps_in([line]):
            return lines
    raise AssertionError("the child did not reach step %d:\n%s" % (n, "".join(lines[-40:])))


def steps_in(lines: list[str]) -> list[int]:
    """The steps the child reported (a console line may share a line with the mark: search, not match)."""
    return [int(match) for line in lines for match in STEP_MARK.findall(line)]


def reached_step(lines: list[str]) -> int:
    return max(steps_in(lines), default=0)


def check_recovery(config, reached: int, caplog) -> dict:
    """The promises after a kill; returns the resumed run's summary."""
    folder = config.run_dir / "checkpoints"
    if (folder / "last.ckpt").exists():
        load_checkpoint(folder / "last.ckpt")  # never unreadable
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="voicesmith"):
        summary = train(load_config(config.path), resume="auto", max_steps=reached + 1)
    assert summary["status"] == "completed" and summary["global_step"] == reached + 1
    assert summary["start_step"] >= reached - INTERVAL, (summary["start_step"], reached)
    assert "was taken over: that process is gone" in caplog.text
    assert not list(folder.glob(".*.tmp-*")), "the killed writer's temporary files are cleared"
    return summary


def run_trials(make_run, caplog, seed: int, trials: int) -> list[tuple[str, int, int]]:
    """`trials` kills, alternating a random moment and the middle of a checkpoint write."""
    rng = random.Random(seed)
    outcomes = []
    for trial in range(trials):
        config = make_run(f"train.checkpoint_every_n_steps={INTERVAL}", "train.keep_last_k=2", name=f"trial-{trial}")
        if trial % 2:  # die inside the k-th checkpoint write (last.ckpt or step-N.ckpt)
            child = start_child(config, str(rng.randint(1, 6)))
            output, _ = child.communicate(timeout=300)
            lines, kind = output.splitlines(), "mid-write"
        else:
            child = start_child(config)
            lines = wait_for_steps(child, 1)
            time.sleep(rng.uniform(0.0, 2.5))
            child.kill()
            rest, _ = child.communicate(timeout=60)
            lines, kind = lines + rest.splitlines(), "random moment"
        assert child.returncode == -signal.SIGKILL, "\n".join(lines[-30:])
        reached = reached_step(lines)
        summary = check_recovery(config, reached, caplog)
        outcomes.append((kind, reached, summary["start_step"]))
    return outcomes


def test_kill_9_three_seeded_trials(make_run, caplog):
    outcomes = run_trials(make_run, caplog, seed=13, trials=3)
    assert [kind for kind, _, _ in outcomes] == ["random moment", "mid-write", "random moment"]


@pytest.mark.slow
def test_kill_9_twenty_seeded_trials(make_run, caplog):
    outcomes = run_trials(make_run, caplog, seed=2026, trials=20)
    lost = [reached - start for _, reached, start in outcomes]
    print("kill -9 trials (kind, step reached, resumed from):", outcomes)
    assert max(lost) <= INTERVAL


@pytest.mark.parametrize("how", [signal.SIGTERM, pytest.param(signal.SIGINT, marks=pytest.mark.slow)],
                         ids=["SIGTERM", "Ctrl-C"])  # Ctrl-C in-process: tests/test_training.py
def test_sigterm_and_ctrl_c_leave_last_ckpt_and_summary(make_run, how):
    config = make_run("train.checkpoint_every_n_steps=1", "train.keep_last_k=0", name=how.name)
    child = subprocess.Popen([sys.executable, "-m", "voicesmith.cli", "train", str(config.path), "--max-steps",
                              str(MAX_STEPS)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    last = config.run_dir / "checkpoints" / "last.ckpt"
    deadline = time.monotonic() + 240
    while not last.is_file():  # a step is done
        assert child.poll() is None and time.monotonic() < deadline, child.stdout.read()
        time.sleep(0.1)
    child.send_signal(how)
    output, _ = child.communicate(timeout=120)
    assert child.returncode == 1, output  # interrupted: run the same command to continue
    summary = read_summary(config.run_dir)
    assert summary["status"] == "interrupted" and summary["checkpoint"] == "checkpoints/last.ckpt"
    assert summary["reason"] == ("SIGTERM" if how == signal.SIGTERM else "interrupted (Ctrl-C)")
    assert load_checkpoint(config.run_dir / "checkpoints" / "last.ckpt")["global_step"] == summary["global_step"] > 0
    assert "Run the same command to continue" in output
