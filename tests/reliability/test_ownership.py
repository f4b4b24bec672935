"""One owner per run directory: a second `train` or `prepare` is refused with the holder's pid and host,
a dead holder's lock is taken over, and `--resume never` moves the old run aside instead of mixing."""

from __future__ import annotations

import logging
import socket
import subprocess
import sys

import pytest
import torch

from voicesmith.checkpoint import load_checkpoint
from voicesmith.rundir import LOCK_FILE, RunDirBusy
from voicesmith.training import train

HOLD = ("import sys, time\n"
        "from voicesmith.rundir import owned_run_dir\n"
        "with owned_run_dir(sys.argv[1], 'train'):\n"
        "    print('held', flush=True)\n"
        "    time.sleep(600)\n")


@pytest.fixture
def holder(make_run):
    """A live process holding the run directory, as a running `voicesmith train` does."""
    config = make_run()
    process = subprocess.Popen([sys.executable, "-c", HOLD, str(config.run_dir)], stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline().strip() == "held"
    yield config, process
    process.kill()
    process.wait()


def test_a_second_train_and_prepare_are_refused_naming_the_holder(holder):
    config, process = holder
    before = sorted(path.name for path in config.run_dir.iterdir())
    with pytest.raises(RunDirBusy, match=rf"in use by pid {process.pid} on host {socket.gethostname()} "
                                         rf"\(`voicesmith train`"):
        train(config, max_steps=1)
    assert sorted(path.name for path in config.run_dir.iterdir()) == before  # no summary.json, no logs written

    result = subprocess.run([sys.executable, "-m", "voicesmith.cli", "prepare", str(config.path)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 2
    assert f"pid {process.pid}" in result.stderr + result.stdout and "wait for it to finish" in result.stderr


def test_a_dead_holders_lock_is_taken_over(holder, caplog):
    config, process = holder
    process.kill()  # kill -9: the process cannot release anything
    process.wait()
    assert str(process.pid) in (config.run_dir / LOCK_FILE).read_text()
    with caplog.at_level(logging.INFO, logger="voicesmith"):
        summary = train(config, max_steps=1)
    assert summary["status"] == "completed"
    assert f"The lock of pid {process.pid} on host {socket.gethostname()}" in caplog.text
    assert (config.run_dir / LOCK_FILE).read_text() == ""  # released at exit


def test_resume_never_moves_the_old_run_aside_and_auto_never_jumps_back(make_run, caplog):
    config = make_run("train.checkpoint_every_n_steps=1", "train.keep_last_k=3")
    assert train(config, max_steps=3)["global_step"] == 3
    old_last = torch.load(config.run_dir / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]

    with caplog.at_level(logging.INFO, logger="voicesmith"):
        summary = train(config, resume="never", max_steps=1)
    moved = [path for path in config.run_dir.iterdir() if path.name.startswith("previous-")]
    assert len(moved) == 1 and f"The previous run (--resume never) was moved to {moved[0]}" in caplog.text
    assert sorted(path.name for path in (moved[0] / "checkpoints").iterdir()) == \
        ["last.ckpt", "step-1.ckpt", "step-2.ckpt", "step-3.ckpt"]
    assert (moved[0] / "summary.json").is_file() and (moved[0] / "logs" / "metrics.csv").is_file()
    assert summary["start_step"] == 0 and summary["global_step"] == 1
    assert sorted(path.name for path in (config.run_dir / "checkpoints").iterdir()) == ["last.ckpt", "step-1.ckpt"]
    assert (config.run_dir / "config.yaml").is_file() and (config.run_dir / "data_report.json").is_file()

    summary = train(config, resume="auto", max_steps=2)  # continues the new run (step 1), not the old one (step 3)
    assert (summary["start_step"], summary["global_step"]) == (1, 2)
    resumed = load_checkpoint(config.run_dir / "checkpoints" / "last.ckpt")["state_dict"]
    assert not torch.equal(resumed["model.encoder.embedding.weight"], old_last["model.encoder.embedding.weight"])
