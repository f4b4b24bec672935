"""Resume is exact: a run interrupted (mid-epoch, or at an epoch's end) and resumed ends with the same
weights, bit for bit, as one that never stopped (CPU, deterministic settings)."""

from __future__ import annotations

import pytest
import torch
from lightning.pytorch.callbacks import Callback
from reliability_helpers import QUICK

from voicesmith.training import train

# 8 training items in batches of 4, 2 batches an epoch; 7 steps cross three epochs
STEPS = 7


class StopAt(Callback):
    """As the batch after `step` starts: Ctrl-C (last.ckpt is saved then) or a crash (which saves nothing:
    the run resumes from the last.ckpt written as step `step` ended, as after kill -9)."""

    def __init__(self, step: int, how: str):
        self.step, self.how = step, how

    def on_train_batch_start(self, trainer, *args) -> None:
        if trainer.global_step == self.step:
            raise KeyboardInterrupt if self.how == "ctrl-c" else RuntimeError("crash")


class BatchIds(Callback):
    def __init__(self):
        self.ids: list[list[str]] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.ids.append(list(batch["ids"]))


def final_weights(config) -> dict[str, torch.Tensor]:
    return torch.load(config.run_dir / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, demo_corpus, reliability_cache):
    """The reference run: its final weights and the ids of every batch it trained on."""
    from voicesmith.config import apply_override, preset_dict, validate_config

    raw = preset_dict("tiny", str(demo_corpus))
    for item in [f"data.cache_dir={reliability_cache}", *QUICK]:
        apply_override(raw, item)
    config = validate_config(raw, source="test")
    config.save(tmp_path_factory.mktemp("reference") / "config.yaml")
    batches = BatchIds()
    assert train(config, max_steps=STEPS, callbacks=[batches])["global_step"] == STEPS
    return final_weights(config), batches.ids


@pytest.mark.parametrize("how, stop_at", [("ctrl-c", 3), ("crash", 3), ("crash", 4)],
                         ids=["ctrl-c-mid-epoch", "crash-mid-epoch", "crash-at-epoch-end"])
def test_interrupted_and_resumed_ends_with_the_same_weights(make_run, uninterrupted, how, stop_at):
    reference_weights, reference_batches = uninterrupted
    config = make_run("train.checkpoint_every_n_steps=1")  # last.ckpt as each step ends
    first, second = BatchIds(), BatchIds()
    try:
        train(config, max_steps=STEPS, callbacks=[StopAt(stop_at, how), first])
    except RuntimeError:
        assert how == "crash"
    summary = train(config, max_steps=STEPS, callbacks=[second])
    assert (summary["start_step"], summary["global_step"]) == (stop_at, STEPS)
    assert first.ids[:stop_at] + second.ids == reference_batches  # no batch replayed, none left out
    weights = final_weights(config)
    assert weights.keys() == reference_weights.keys()
    different = [name for name in weights if not torch.equal(weights[name], reference_weights[name])]
    assert different == []
