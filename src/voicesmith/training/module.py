"""The LightningModule that trains every voicesmith model (acoustic today; VITS and vocoders are GANs).

Every model trains with Lightning's *manual* optimisation, on purpose. The engine must skip a batch
whose loss is not finite, or that runs out of memory twice, without taking an optimizer step, and
must retry an out-of-memory batch at half size. Under automatic optimisation a skipped batch still
counts as an optimizer step (Lightning calls `optimizer.step` whatever `training_step` returns),
Lightning refuses a skipped step under DDP outright, and an out-of-memory error in the backward
pass is raised outside `training_step`, where no retry is possible. So the step is written here:
forward, agree across ranks whether the loss is usable, backward (Lightning scales it for mixed
precision and syncs DDP gradients), clip, step. Lightning still does precision, the grad scaler,
DDP, checkpoint state of optimizers and schedulers, logging and the loops.

Two step shapes, chosen by the model:
- single-loss models (`forward(batch).losses`): one optimizer;
- GANs (`model.is_gan = True`, see `GanModel`): a discriminator then a generator update per batch,
  which together count as one step (`global_step` counts generator updates only).
"""

from __future__ import annotations

import gc
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterable, Optional, Protocol

import lightning as L
import torch
from torch import Tensor, nn

from voicesmith.checkpoint import voicesmith_block
from voicesmith.config import VoiceConfig
from voicesmith.errors import ConfigError, RunFailed
from voicesmith.training.freeze import FrozenWarmup
from voicesmith.training.guard import LossWatch, SkipGuard
from voicesmith.training.rng import rng_state, set_rng_state
from voicesmith.training.schedules import build_scheduler

if TYPE_CHECKING:
    from voicesmith.text import SymbolTable

log = logging.getLogger(__name__)

TRAIN_STATE_KEY = "voicesmith_train"  # engine state in a checkpoint: RNG streams and skip counts


class GanModel(Protocol):
    """What the engine needs from a GAN (VITS, vocoders): two parameter sets and two sets of raw losses."""

    is_gan: bool

    def generator_parameters(self) -> Iterable[nn.Parameter]: ...
    def discriminator_parameters(self) -> Iterable[nn.Parameter]: ...
    def forward(self, batch: dict) -> Any: ...  # the generator pass; its output feeds both loss functions
    def discriminator_losses(self, batch: dict, output: Any) -> dict[str, Tensor]: ...
    def generator_losses(self, batch: dict, output: Any) -> dict[str, Tensor]: ...
    def loss_names(self) -> list[str]: ...


@dataclass
class StepResult:
    """What one training batch did: the raw losses, or the reason it was skipped."""

    losses: dict[str, Tensor] = field(default_factory=dict)
    total: Optional[Tensor] = None
    grad_norm: Optional[Tensor] = None
    skipped: Optional[str] = None
    detail: str = ""


def loss_weights(model: nn.Module, config: VoiceConfig) -> dict[str, float]:
    """The weight of each loss the model produces; a loss with no config field weighs 1."""
    configured = config.model.loss_weights
    return {name: float(getattr(configured, name, 1.0)) for name in model.loss_names()}


def weighted_total(losses: dict[str, Tensor], weights: dict[str, float]) -> Tensor:
    return sum(weights.get(name, 1.0) * value for name, value in losses.items())


def describe_losses(losses: dict[str, Tensor]) -> str:
    """The losses of a skipped batch; all finite here means another rank's were not (DDP skips together)."""
    text = ", ".join(f"{name}={value.item():.4g}" for name, value in losses.items())
    finite = all(torch.isfinite(value).all() for value in losses.values())
    return text + (" (another rank's loss was not finite)" if finite else "")


def halve_batch(batch: dict) -> Optional[dict]:
    """The first half of a batch with its padding trimmed to the new longest item; None for one item."""
    size = len(batch["ids"])
    if size < 2:
        return None
    keep = (size + 1) // 2
    half = {key: value[:keep] for key, value in batch.items()}
    for padded, lengths in (("phoneme_ids", "phoneme_lengths"), ("mels", "mel_lengths"), ("audio", "audio_lengths")):
        if padded in half and lengths in half:
            half[padded] = half[padded][..., : int(half[lengths].max())]
    return half


def overflowed(scaler, optimizer) -> Optional[Tensor]:
    """Under a grad scaler (16-mixed): the scaled gradient norm when it is not finite, after lowering the
    loss scale as the scaler's own skipped step would; None when the step may go ahead.

    Checked before `optimizer.step()`, so an overflowed batch is skipped and counted (fp16_overflow)
    like any other, and neither the step counter nor the schedule advances. (The scaler alone would
    skip the update silently while Lightning counted the step.) DDP has all-reduced the gradients by
    now, so every rank reaches the same answer.
    """
    grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
    norm = torch.nn.utils.get_total_norm(grads)
    if torch.isfinite(norm):
        return None
    scaler.update(scaler.get_scale() * scaler.get_backoff_factor())
    return norm


def free_accelerator_memory() -> None:
    gc.collect()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()
    if torch.backends.mps.is_available():
        torch.mps.empty_cache()


class VoiceModule(L.LightningModule):
    """`.model` is the plain nn.Module being trained; `.config`, `.symbols`, `.speakers` describe the voice.

    Pass `model` to train a module built elsewhere; without it the model of `config.model` is built
    in `configure_model` from the datamodule's symbols and speakers (after data preparation, which
    under DDP runs once per node before every rank builds its model).
    """

    def __init__(self, config: VoiceConfig, model: Optional[nn.Module] = None,
                 guard: Optional[SkipGuard] = None, fresh_start: bool = True):
        super().__init__()
        self.automatic_optimization = False
        self.config = config
        self.model = model
        self.symbols: Optional["SymbolTable"] = None  # from the datamodule, in configure_model
        self.speakers: dict[str, int] = {}
        self.guard = guard or SkipGuard.from_config(config.train)
        self.loss_watch = LossWatch()
        self.fresh_start = fresh_start
        self.weights: dict[str, float] = {}
        self.last_losses: dict[str, Tensor] = {}
        self.current_ids: list[str] = []
        self.val_nonfinite = 0
        self.updating = False  # gradients are being exchanged or applied: an out-of-memory error cannot be skipped
        self.warmup: Optional[FrozenWarmup] = None
        if model is not None:
            self._prepare_model()

    @property
    def is_gan(self) -> bool:
        return bool(getattr(self.model, "is_gan", False))

    def setup(self, stage: str) -> None:
        if self.trainer.global_rank != 0:
            self.guard.log_path = None  # every rank counts the same skips; rank 0 writes them down

    # --- model ------------------------------------------------------------------------------------

    def configure_model(self) -> None:
        datamodule = self.trainer.datamodule
        if self.symbols is None:
            self.symbols, self.speakers = datamodule.symbols, datamodule.speakers
        if self.model is not None:
            return
        from voicesmith.models import build_model

        self.model = build_model(self.config.model, len(self.symbols), self.config.audio.n_mels,
                                 max(1, len(self.speakers)), self.config.resolve, self.config.audio)
        if self.fresh_start and hasattr(self.model, "set_mel_stats"):
            self.model.set_mel_stats(*datamodule.mel_stats())
        self._prepare_model()

    def _prepare_model(self) -> None:
        train, hardware = self.config.train, self.config.hardware
        if self.fresh_start and train.init_from:
            self._init_from(train.init_from)
        if train.gradient_checkpointing:
            if not hasattr(self.model, "set_gradient_checkpointing"):
                raise ConfigError(f"train.gradient_checkpointing=true, but {type(self.model).__name__} has no "
                                  f"gradient checkpointing; set it to false.")
            self.model.set_gradient_checkpointing(True)
        if hardware.compile:
            self.model.compile()
        self.warmup = FrozenWarmup.from_config(self.model, train)
        self.weights = loss_weights(self.model, self.config)

    def _init_from(self, path: str) -> None:
        """Fine-tuning: start from another voice's weights, tables mapped by symbol and speaker name
        (its optimizer and step are not taken)."""
        from voicesmith.checkpoint import load_checkpoint
        from voicesmith.training.init_from import warm_start

        source = self.config.resolve(path)
        report = warm_start(self.model, load_checkpoint(source), self.symbols, self.speakers,
                            self.config.model.type, source)
        log.info(report.describe(source))

    # --- optimisation ------------------------------------------------------------------------------

    def configure_optimizers(self):
        train = self.config.train
        total_steps = max(1, int(self.trainer.estimated_stepping_batches))

        # The fused kernel updates each tensor in one pass: no per-parameter temporaries (measured on a
        # VITS step: a third less optimizer time and hundreds of MB less peak memory on the CPU).
        fused = self.device.type in ("cpu", "cuda")

        def adamw(parameters: Iterable[nn.Parameter]) -> torch.optim.Optimizer:
            trainable = [p for p in parameters if p.requires_grad]
            return torch.optim.AdamW(trainable, lr=train.learning_rate, betas=tuple(train.betas),
                                     weight_decay=train.weight_decay, fused=fused)

        if self.is_gan:
            optimizers = [adamw(self.model.generator_parameters()), adamw(self.model.discriminator_parameters())]
        else:
            optimizers = [adamw(self.model.parameters())]
        schedulers = [{"scheduler": build_scheduler(opt, train, total_steps), "interval": "step"} for opt in optimizers]
        return optimizers, schedulers

    def training_step(self, batch: dict, batch_idx: int) -> None:
        self.current_ids = batch["ids"]
        result = self._run_with_memory_retry(batch)
        if result.skipped:
            self.guard.skip(result.skipped, batch["ids"], self.global_step, result.detail)  # may stop the run
        else:
            self.guard.ok()
            self._log_step(result, len(batch["ids"]))
        self.current_ids = []  # set only while a batch trains, so an error report names the right items

    def _run_with_memory_retry(self, batch: dict) -> StepResult:
        """Out of memory: free the cache, retry once at half size, then skip (under DDP: skip on every rank)."""
        self.updating = False
        try:
            return self._optimize(batch)
        except torch.OutOfMemoryError as exc:
            message = str(exc).splitlines()[0] if str(exc) else "out of memory"
        free_accelerator_memory()
        if self.trainer.world_size > 1:
            return self._skip_together(batch, message)
        half = halve_batch(batch)
        if half is not None:
            try:
                result = self._optimize(half)
            except torch.OutOfMemoryError as exc:
                message = str(exc).splitlines()[0] if str(exc) else message
            else:
                if not result.skipped:
                    self.guard.recover("out_of_memory_half_batch", batch["ids"], self.global_step,
                                       f"{message}; trained on the first {len(half['ids'])} items instead")
                return result
            free_accelerator_memory()
        return StepResult(skipped="out_of_memory", detail=message)

    def _skip_together(self, batch: dict, message: str) -> StepResult:
        """DDP, out of memory before the backward pass: join the ranks' agreement (the other ranks wait in it),
        so every rank skips this batch. Inside the backward pass or the update, the others already wait in a
        gradient all-reduce this rank cannot rejoin: the run stops (at once, never a hang)."""
        if self.updating:
            raise RunFailed(f"Out of memory at step {self.global_step} on rank {self.global_rank} during the backward "
                            f"pass or the update (items {', '.join(batch['ids'])}): {message}. Under DDP that batch "
                            f"cannot be skipped on every rank; lower train.batch_size or data.max_frames_per_batch.")
        self._agree_to_skip(torch.tensor(False), out_of_memory=True)
        return StepResult(skipped="out_of_memory", detail=f"{message} (rank {self.global_rank}; every rank skipped "
                                                          f"the batch)")

    def _optimize(self, batch: dict) -> StepResult:
        if self.warmup is not None:
            self.warmup.apply(self.global_step)
        if self.is_gan:
            return self._optimize_gan(batch)
        optimizer, scheduler = self.optimizers(), self.lr_schedulers()
        losses = self.model(batch).losses
        total = weighted_total(losses, self.weights)
        norm, skipped = self._checked_backward(total, losses, optimizer)
        if skipped is not None:
            return skipped
        optimizer.step()
        scheduler.step()
        return StepResult(losses=losses, total=total, grad_norm=norm)

    def _optimize_gan(self, batch: dict) -> StepResult:
        """Discriminator update, then generator update; only the generator update counts as the step."""
        (opt_g, opt_d), (sched_g, sched_d) = self.optimizers(), self.lr_schedulers()
        output = self.model(batch)
        d_losses = self.model.discriminator_losses(batch, output)
        d_total = weighted_total(d_losses, self.weights)
        _, skipped = self._checked_backward(d_total, d_losses, opt_d, "discriminator: ")
        if skipped is not None:
            return skipped
        self.trainer.strategy.optimizer_step(opt_d.optimizer, closure=_no_closure)  # not counted as a step
        opt_d.zero_grad(set_to_none=True)  # its gradients would sit in memory through the generator update
        sched_d.step()
        self.updating = False  # every rank has applied the same update: the generator pass may skip together again
        g_losses = self.model.generator_losses(batch, output)
        g_total = weighted_total(g_losses, self.weights)
        norm_g, skipped = self._checked_backward(g_total, g_losses, opt_g,
                                                 "generator (after the discriminator update): ")
        if skipped is not None:
            return skipped
        opt_g.step()
        opt_g.zero_grad(set_to_none=True)
        sched_g.step()
        return StepResult(losses={**d_losses, **g_losses}, total=d_total.detach() + g_total.detach(), grad_norm=norm_g)

    def _checked_backward(self, total: Tensor, losses: dict[str, Tensor], optimizer,
                          what: str = "") -> tuple[Optional[Tensor], Optional[StepResult]]:
        """Backward and clip, or the reason to skip: a non-finite loss (on any rank) or gradient norm."""
        nonfinite, out_of_memory = self._agree_to_skip(~torch.isfinite(total))
        if out_of_memory:
            return None, StepResult(skipped="out_of_memory", detail=f"{what}another rank ran out of memory; every "
                                                                    f"rank skipped the batch")
        if nonfinite:
            return None, StepResult(skipped="nonfinite_loss", detail=what + describe_losses(losses))
        norm = self._backward_and_clip(total, optimizer)
        if norm is not None and not torch.isfinite(norm):
            optimizer.zero_grad(set_to_none=True)
            if self._grad_scaler() is not None:
                return None, StepResult(skipped="fp16_overflow", detail=f"{what}scaled gradient norm {norm.item()}; "
                                        f"loss scale lowered to {self._grad_scaler().get_scale():g}")
            return None, StepResult(skipped="nonfinite_gradient", detail=f"{what}gradient norm {norm.item()}")
        return norm, None

    def _backward_and_clip(self, total: Tensor, optimizer) -> Optional[Tensor]:
        """Backward, then clip and measure the gradient norm (after unscaling, under a grad scaler)."""
        optimizer.zero_grad(set_to_none=True)
        self.updating = True
        self.manual_backward(total)
        if self._grad_scaler() is not None:  # clipped in on_before_optimizer_step, after the scaler unscales
            return overflowed(self._grad_scaler(), optimizer)
        return self._clip(optimizer)

    def on_before_optimizer_step(self, optimizer) -> None:
        if self._grad_scaler() is not None:
            self._clip(optimizer)

    def _clip(self, optimizer) -> Tensor:
        parameters = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        max_norm = self.config.train.grad_clip_norm
        if max_norm is None:
            return torch.nn.utils.get_total_norm([p.grad for p in parameters])
        return torch.nn.utils.clip_grad_norm_(parameters, max_norm)

    def _grad_scaler(self):
        return getattr(self.trainer.precision_plugin, "scaler", None)

    def _agree_to_skip(self, nonfinite: Tensor, out_of_memory: bool = False) -> tuple[bool, bool]:
        """(any rank's loss is not finite, any rank ran out of memory): one all-reduce that every rank
        joins once per update, also the rank that failed before reaching its loss."""
        flags = torch.stack([nonfinite.detach().float().reshape(()).to(self.device),
                             torch.tensor(float(out_of_memory), device=self.device)])
        if self.trainer.world_size > 1:
            flags = self.trainer.strategy.reduce(flags, reduce_op="sum")
        nonfinite_anywhere, out_of_memory_anywhere = flags.tolist()  # one device sync
        return bool(nonfinite_anywhere), bool(out_of_memory_anywhere)

    def _any_rank(self, flag: Tensor) -> bool:
        """True on every rank when it is true on any: ranks must skip together or DDP hangs."""
        if self.trainer.world_size > 1:
            flag = self.trainer.strategy.reduce(flag.float(), reduce_op="sum")
        return bool(flag)

    # --- logging ------------------------------------------------------------------------------------

    def _log_step(self, result: StepResult, batch_size: int) -> None:
        losses = {name: value.detach() for name, value in result.losses.items()}
        self.last_losses = {**losses, "total": result.total.detach()}
        shown = {f"loss/{name}": value for name, value in self.last_losses.items()}  # raw, and the total
        values = {f"loss_weighted/{name}": value * self.weights.get(name, 1.0) for name, value in losses.items()}
        if result.grad_norm is not None:
            values["grad_norm"] = result.grad_norm
        # The x-axis of every logger is the optimizer step (Lightning counts batches, skipped ones too).
        values["step"] = float(self.global_step)
        self.log_dict(shown, on_step=True, on_epoch=False, batch_size=batch_size, prog_bar=True)
        self.log_dict(values, on_step=True, on_epoch=False, batch_size=batch_size)
        optimizer = self.optimizers()[0] if self.is_gan else self.optimizers()
        self.log("lr", optimizer.param_groups[0]["lr"], on_step=True, on_epoch=False, batch_size=batch_size)
        self.loss_watch.update(float(result.total.detach()), self.global_step)

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        if self.is_gan:
            losses = self.model.generator_losses(batch, self.model(batch))
        else:
            losses = self.model(batch).losses
        total = weighted_total(losses, self.weights)
        if self._any_rank(~torch.isfinite(total)):  # every rank leaves it out, or val_loss's all-reduce hangs
            self.val_nonfinite += 1
            log.warning("Validation batch with a non-finite loss left out of val_loss (%s): items %s",
                        describe_losses(losses), ", ".join(batch["ids"]))
            return
        size = len(batch["ids"])
        self.log("val_loss", total, on_epoch=True, batch_size=size, sync_dist=True, prog_bar=True)
        for name, value in losses.items():
            self.log(f"val/{name}", value, on_epoch=True, batch_size=size, sync_dist=True)

    # --- checkpoint ---------------------------------------------------------------------------------

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["voicesmith"] = voicesmith_block(self.config, self.symbols, self.speakers, self.global_step)
        checkpoint[TRAIN_STATE_KEY] = {"rng": rng_state(), "skip_guard": self.guard.state_dict()}

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        block = checkpoint.get("voicesmith", {})
        if self.symbols is not None and block.get("symbols") not in (None, self.symbols.to_dict()):
            raise ConfigError("The checkpoint was trained with another symbol table than this run's feature cache "
                              "(the phoneme ids moved). Resume with the cache it was trained on, or start a new "
                              "run with --resume never.")
        if self.symbols is not None and block.get("speakers") not in (None, dict(self.speakers)):
            raise ConfigError(speakers_changed(block["speakers"], self.speakers))
        state = checkpoint.get(TRAIN_STATE_KEY)
        if state:
            set_rng_state(state["rng"])
            self.guard.load_state_dict(state["skip_guard"])


def speakers_changed(trained: dict[str, int], now: dict[str, int]) -> str:
    """Why a run cannot resume after its corpus gained speakers, and the two ways on."""
    new = sorted(set(now) - set(trained)) or sorted(name for name in now if now[name] != trained.get(name))
    return (f"The corpus has speakers the checkpoint was not trained with ({', '.join(new[:10])}); a resumed run "
            f"keeps its speaker table (one row of the speaker embedding per id). Remove their items to resume, or "
            f"start a new run from these weights: copy checkpoints/last.ckpt out of the run directory and run "
            f"`voicesmith train CONFIG --resume never --set train.init_from=THAT_COPY` (speakers are matched by "
            f"name, the new ones start fresh).")


def _no_closure() -> None:
    """The closure of an optimizer step whose backward already ran."""
    return None
