"""Numbers: an fp16 overflow is skipped and counted (fp16_overflow) before the optimizer step, with a real
torch.amp.GradScaler; NaN, exploding and out-of-memory batches never reach a checkpoint."""

from __future__ import annotations

import torch
from lightning.pytorch.callbacks import Callback
from torch import nn

from voicesmith.checkpoint import load_checkpoint
from voicesmith.training import train
from voicesmith.training.guard import SkipGuard
from voicesmith.training.module import overflowed


def scaled_step(model: nn.Module, scaler: torch.amp.GradScaler, optimizer, scale_input: float):
    """One fp16-style update: backward of the scaled loss, then the overflow check the engine makes."""
    optimizer.zero_grad(set_to_none=True)
    loss = model(torch.full((2, 4), scale_input)).pow(2).mean()
    scaler.scale(loss).backward()
    norm = overflowed(scaler, optimizer)
    if norm is None:
        scaler.step(optimizer)
        scaler.update()
    return norm


def test_an_fp16_overflow_is_skipped_counted_and_lowers_the_scale():
    torch.manual_seed(0)
    model = nn.Linear(4, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 16)
    guard = SkipGuard(window=10, max_fraction=0.5)

    assert scaled_step(model, scaler, optimizer, 1.0) is None  # finite: the update happens
    weights = model.weight.detach().clone()

    norm = scaled_step(model, scaler, optimizer, 1e30)  # (1e30)^2 * 2^16 overflows
    assert norm is not None and not torch.isfinite(norm)
    guard.skip("fp16_overflow", ["a", "b"], 1, f"scaled gradient norm {norm.item()}")
    assert torch.equal(model.weight.detach(), weights)  # no update was applied
    assert scaler.get_scale() == 2.0 ** 15  # backed off, as the scaler's own skipped step would
    assert guard.summary()["batches_skipped"] == {"fp16_overflow": 1}
    assert "bf16-mixed" in guard.describe()

    assert scaled_step(model, scaler, optimizer, 1.0) is None  # and training goes on at the lower scale
    assert not torch.equal(model.weight.detach(), weights)


class Faults(Callback):
    """Per training batch index: a NaN loss, an infinite loss, infinite gradients from a finite loss, or out
    of memory (always, or only at full size: retried at half size)."""

    def __init__(self, plan: dict[int, str]):
        self.plan, self.batch = plan, 0

    def on_train_start(self, trainer, pl_module) -> None:
        model, forward = pl_module.model, pl_module.model.forward

        def faulty(batch):
            fault = self.plan.get(self.batch) if model.training else None
            if fault == "oom" or (fault == "oom_full_size" and len(batch["ids"]) > 2):
                raise torch.OutOfMemoryError("CUDA out of memory (injected)")
            output = forward(batch)
            if fault == "nan":
                output.losses["mel"] = output.losses["mel"] * float("nan")
            elif fault == "explode":
                output.losses["mel"] = output.losses["mel"] * 1e38 * 1e38  # inf loss
            elif fault == "explode_gradient":
                output.losses["mel"] = output.losses["mel"] * 3e38  # finite loss, inf gradients
            return output

        model.forward = faulty

    def on_train_batch_end(self, trainer, *args) -> None:
        self.batch += 1


def test_bad_batches_are_skipped_by_reason_and_never_checkpointed(make_run):
    config = make_run("train.checkpoint_every_n_steps=1", "train.keep_last_k=20", "train.max_consecutive_skipped=5")
    faults = Faults({1: "nan", 2: "explode", 4: "explode_gradient", 5: "oom_full_size", 6: "oom"})
    summary = train(config, max_steps=6, callbacks=[faults])
    assert summary["status"] == "completed" and summary["global_step"] == 6
    assert summary["batches_skipped"] == {"nonfinite_loss": 2, "nonfinite_gradient": 1, "out_of_memory": 1}
    assert summary["batches_recovered"] == {"out_of_memory_half_batch": 1}
    folder = config.run_dir / "checkpoints"
    checkpoints = sorted(folder.glob("*.ckpt"))
    assert len(checkpoints) == 7  # step-1..6 and last
    for path in checkpoints:
        state = load_checkpoint(path)
        assert all(torch.isfinite(value).all() for value in state["state_dict"].values()), path.name
        for optimizer_state in state["optimizer_states"]:
            for buffers in optimizer_state["state"].values():
                assert all(torch.isfinite(value).all() for value in buffers.values() if torch.is_tensor(value))


class NanValidation(Callback):
    def on_train_start(self, trainer, pl_module) -> None:
        model, forward = pl_module.model, pl_module.model.forward

        def faulty(batch):
            output = forward(batch)
            if not model.training:
                output.losses["mel"] = output.losses["mel"] * float("nan")
            return output

        model.forward = faulty


def test_a_validation_round_with_no_finite_loss_is_counted_not_fatal(make_run, caplog):
    config = make_run("train.val_every_n_steps=2")
    summary = train(config, max_steps=4, callbacks=[NanValidation()])
    assert summary["status"] == "completed" and summary["global_step"] == 4
    assert summary["validation_batches_nonfinite"] == 2 and summary["best_checkpoint"] is None
    assert "No validation batch had a finite loss at step 2: best.ckpt is not updated" in caplog.text
