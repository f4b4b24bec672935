"""Hardware from the config, never hard-coded: accelerator, devices, precision, backend switches.

Everything is checked before the first tensor is made, so a wrong setting is one clear message
(`hardware.precision=16-mixed needs a CUDA GPU ...`), not a stack trace minutes into a run.
CUDA's own debug switches are environment variables it reads once, when it initialises:
`apply_env_switches` sets them first thing.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Mapping, Optional, Union

import torch

from voicesmith.config import HardwareConfig
from voicesmith.errors import ConfigError

log = logging.getLogger(__name__)

LIGHTNING_PRECISION = {"32": "32-true", "32-true": "32-true", "bf16-mixed": "bf16-mixed", "16-mixed": "16-mixed"}


def apply_env_switches(hw: HardwareConfig) -> dict[str, str]:
    """CUDA_LAUNCH_BLOCKING and PYTORCH_CUDA_ALLOC_CONF, set before CUDA starts (they are ignored after)."""
    wanted = {}
    if hw.cuda_launch_blocking:
        wanted["CUDA_LAUNCH_BLOCKING"] = "1"
    if hw.cuda_alloc_conf:
        wanted["PYTORCH_CUDA_ALLOC_CONF"] = hw.cuda_alloc_conf
    if wanted and torch.cuda.is_initialized():
        log.warning("CUDA was already initialised, so %s take no effect in this process; set them in the "
                    "environment before starting python.", ", ".join(wanted))
    os.environ.update(wanted)
    return wanted


def resolve_accelerator(hw: HardwareConfig) -> str:
    """'cpu', 'cuda' or 'mps'; an accelerator that is asked for but missing is refused, not replaced."""
    cuda, mps = torch.cuda.is_available(), torch.backends.mps.is_available()
    if hw.accelerator == "auto":
        return "cuda" if cuda else "mps" if mps else "cpu"
    if hw.accelerator == "cpu":
        return "cpu"
    if hw.accelerator == "gpu" and (cuda or mps):
        return "cuda" if cuda else "mps"
    if hw.accelerator == "mps" and mps:
        return "mps"
    if hw.accelerator == "cuda" and cuda:
        return "cuda"
    raise ConfigError(f"hardware.accelerator={hw.accelerator} but this machine has no such device "
                      f"(torch {torch.__version__}: CUDA available: {cuda}, MPS available: {mps}). "
                      f"Use hardware.accelerator=auto or cpu, or install the torch build for your GPU.")


def check_precision(accelerator: str, precision: str) -> str:
    """The Lightning precision string, or a ConfigError when the device cannot do it."""
    if precision == "16-mixed":
        if accelerator == "cpu":
            raise ConfigError("hardware.precision=16-mixed needs a CUDA GPU (or Apple MPS); on CPU use 32 or "
                              "bf16-mixed.")
        if accelerator == "mps" and not torch.amp.autocast_mode.is_autocast_available("mps"):
            raise ConfigError("hardware.precision=16-mixed is not supported on MPS by this torch "
                              f"({torch.__version__}); use 32.")
    if precision == "bf16-mixed":
        if accelerator == "cuda" and not torch.cuda.is_bf16_supported():
            raise ConfigError(f"hardware.precision=bf16-mixed needs a GPU with bfloat16 support; "
                              f"{torch.cuda.get_device_name()} has none. Use 16-mixed or 32.")
        if accelerator == "mps" and not torch.backends.mps.is_macos_or_newer(14, 0):
            raise ConfigError("hardware.precision=bf16-mixed on MPS needs macOS 14 or newer; use 32.")
    return LIGHTNING_PRECISION[precision]


def configure_backends(hw: HardwareConfig, accelerator: str) -> None:
    """TF32 matmuls/convolutions on Ampere+ GPUs: about 2x faster at a precision training does not notice."""
    if accelerator == "cuda":
        torch.set_float32_matmul_precision("high" if hw.tf32 else "highest")
        torch.backends.cudnn.allow_tf32 = hw.tf32


def resolve_devices(hw: HardwareConfig, env: Optional[Mapping[str, str]] = None) -> tuple[Union[int, str], int]:
    """(devices per node, nodes). Under torchrun or SLURM's srun the processes are already decided: use the
    launcher's layout where the config keeps its defaults (devices 1 or auto, one node)."""
    env = os.environ if env is None else env
    devices, nodes = hw.devices, hw.num_nodes
    launched = env.get("LOCAL_WORLD_SIZE")
    if launched and int(launched) > 1 and hw.devices in (1, "auto"):
        log.info("Started by torchrun with %s processes per node: hardware.devices=%s", launched, launched)
        devices = int(launched)
    elif "SLURM_NTASKS" in env and "SLURM_NNODES" in env and env.get("SLURM_JOB_NAME") not in ("bash", "interactive"):
        slurm_nodes = int(env["SLURM_NNODES"])
        per_node = _slurm_tasks_per_node(env, slurm_nodes)
        if hw.devices in (1, "auto") and per_node > 1:
            devices = per_node
        if hw.num_nodes == 1 and slurm_nodes > 1:
            nodes = slurm_nodes
        if (devices, nodes) != (hw.devices, hw.num_nodes):
            log.info("Started by SLURM with %s task(s) per node on %s node(s): hardware.devices=%s, "
                     "hardware.num_nodes=%s", per_node, slurm_nodes, devices, nodes)
    return devices, nodes


def _slurm_tasks_per_node(env: Mapping[str, str], nodes: int) -> int:
    """SLURM_NTASKS_PER_NODE ("4", or "4(x2)" in SLURM_TASKS_PER_NODE), else the tasks spread evenly."""
    text = env.get("SLURM_NTASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE", "")
    head = text.split("(")[0].split(",")[0]
    return int(head) if head.isdigit() else max(1, int(env["SLURM_NTASKS"]) // max(nodes, 1))


def strategy_for(hw: HardwareConfig, devices: Union[int, str], has_unused_parameters: bool,
                 num_nodes: Optional[int] = None) -> str:
    """DDP when more than one process trains; GANs leave one network idle in each backward pass, so
    their DDP must look for unused parameters (a plain `ddp` asked for by name is upgraded, with a note)."""
    if hw.strategy == "ddp" and has_unused_parameters:
        log.info("hardware.strategy=ddp: using ddp_find_unused_parameters_true, since each of this model's "
                 "two updates leaves the other network without gradients.")
        return "ddp_find_unused_parameters_true"
    if hw.strategy != "auto":
        return hw.strategy
    several = (isinstance(devices, int) and devices > 1) or (num_nodes or hw.num_nodes) > 1
    if not several:
        return "auto"
    return "ddp_find_unused_parameters_true" if has_unused_parameters else "ddp"


def trainer_hardware(hw: HardwareConfig, has_unused_parameters: bool = False) -> dict[str, Any]:
    """The Trainer arguments of the hardware section, checked."""
    accelerator = resolve_accelerator(hw)
    precision = check_precision(accelerator, hw.precision)
    configure_backends(hw, accelerator)
    devices, num_nodes = resolve_devices(hw)
    return dict(accelerator=accelerator, devices=devices, num_nodes=num_nodes,
                strategy=strategy_for(hw, devices, has_unused_parameters, num_nodes), precision=precision,
                detect_anomaly=hw.detect_anomaly, deterministic=hw.deterministic)
