"""The part every importer shares: source tensors (already renamed to voicesmith's names) -> a VitsModel.

Importers only translate names; this module fills the model and accounts for every tensor:
- weight norm in any of its forms fills the model's parametrization: old-style `weight_g`/`weight_v`,
  the new `parametrizations.weight.original0/1`, or a plain `weight` from which the norm was folded
  away (ONNX exports, transformers decoders): then original1 = w and original0 = ||w|| per channel,
  so the effective weight is exactly w;
- a shape that differs is an error naming the tensor and both shapes, never a silent skip;
- target tensors the source lacks are allowed only under the prefixes an importer names as fresh
  (e.g. the posterior encoder of an ONNX voice), and are reported;
- source tensors with no use are reported by name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping, Optional, Union

import torch
from torch import Tensor, nn

from voicesmith.errors import DataError

WEIGHT_NORM = ".parametrizations.weight.original"  # + "0" (g, the norm) / "1" (v, the direction)


@dataclass
class ImportReport:
    """What an import took from its source and what starts fresh; saved as RUN_DIR/import_report.json."""

    source: str
    kind: str
    mapped: int = 0  # target tensors filled from the source
    fresh: dict[str, list[str]] = field(default_factory=dict)  # reason -> target tensors left as initialised
    unused: list[str] = field(default_factory=list)  # source tensors with no target
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"source": self.source, "kind": self.kind, "mapped": self.mapped,
                "fresh": {reason: list(names) for reason, names in self.fresh.items()},
                "fresh_count": sum(len(names) for names in self.fresh.values()),
                "unused": list(self.unused), "notes": list(self.notes)}

    def describe(self) -> str:
        lines = [f"Imported {self.kind} voice {self.source}: {self.mapped} tensors mapped."]
        for reason, names in self.fresh.items():
            lines.append(f"  {len(names)} tensors start fresh: {reason} ({_some(names)})")
        if self.unused:
            lines.append(f"  {len(self.unused)} source tensors have no use here: {_some(self.unused)}")
        lines += [f"  {note}" for note in self.notes]
        return "\n".join(lines)


def load_into(model: nn.Module, tensors: Mapping[str, Tensor], report: ImportReport,
              fresh_prefixes: Optional[Mapping[str, str]] = None) -> None:
    """Fill `model` from `tensors` (voicesmith names; weight norm in any form) and record it in `report`.

    `fresh_prefixes`: target name prefix -> why the source has no weights for it. Any other target the
    source lacks, and any shape that differs, is a DataError listing all of them.
    """
    state = model.state_dict()
    used: set[str] = set()
    missing, mismatched = [], []
    for name, target in state.items():
        value, sources = _source_value(name, tensors, state)
        if value is None:
            missing.append(name)
            continue
        if tuple(value.shape) != tuple(target.shape):
            mismatched.append((name, tuple(value.shape), tuple(target.shape)))
            continue
        state[name] = value.detach().to(target.dtype).clone()
        used.update(sources)
        report.mapped += 1
    _check(missing, mismatched, fresh_prefixes or {}, report)
    model.load_state_dict(state)
    report.unused = sorted(set(tensors) - used)


def _source_value(name: str, tensors: Mapping[str, Tensor],
                  state: Mapping[str, Tensor]) -> tuple[Optional[Tensor], tuple[str, ...]]:
    """The value for target `name` and the source names it came from, or (None, ())."""
    if name in tensors:
        return tensors[name], (name,)
    if WEIGHT_NORM not in name:
        return None, ()
    base, which = name.split(WEIGHT_NORM)
    old_style = f"{base}.weight_{'g' if which == '0' else 'v'}"
    if old_style in tensors:
        return tensors[old_style], (old_style,)
    folded = tensors.get(f"{base}.weight")
    if folded is None:
        return None, ()
    if which == "1":
        return folded, (f"{base}.weight",)
    return channel_norm(folded, tuple(state[name].shape)), (f"{base}.weight",)


def channel_norm(weight: Tensor, norm_shape: tuple[int, ...]) -> Tensor:
    """||w|| over every axis where the parametrization's g has size 1 (its norm axes): shape `norm_shape`."""
    if len(norm_shape) != weight.dim():
        return weight  # its shape differs from the norm's: reported as a mismatch by the caller
    axes = [axis for axis, size in enumerate(norm_shape) if size == 1]
    return torch.linalg.vector_norm(weight.float(), dim=axes, keepdim=True).to(weight.dtype) if axes \
        else weight.abs()


def _check(missing: list[str], mismatched: list, fresh_prefixes: Mapping[str, str], report: ImportReport) -> None:
    unexplained = []
    for name in missing:
        reason = next((why for prefix, why in fresh_prefixes.items() if name.startswith(prefix)), None)
        if reason is None:
            unexplained.append(name)
        else:
            report.fresh.setdefault(reason, []).append(name)
    if not (unexplained or mismatched):
        return
    lines = [f"{report.source} does not fit voicesmith's VITS built from its own settings:"]
    lines += [f"  - {name}: the source has {list(source)}, the model needs {list(target)}"
              for name, source, target in mismatched[:12]]
    lines += [f"  - {name}: not in the source" for name in unexplained[:12]]
    hidden = max(0, len(mismatched) - 12) + max(0, len(unexplained) - 12)
    if hidden:
        lines.append(f"  - ... and {hidden} more")
    lines.append("The voice's files may be damaged, or its architecture differs from VITS/Piper's; "
                 "import an unmodified voice or its training checkpoint.")
    raise DataError("\n".join(lines))


def rename(tensors: Mapping[str, Tensor],
           rules: Iterable[tuple[str, Union[str, Callable[[re.Match], str]]]]) -> dict[str, Tensor]:
    """Names rewritten by `re.sub` rules applied in order (each rule once to every name)."""
    compiled = [(re.compile(pattern), replacement) for pattern, replacement in rules]
    renamed = {}
    for name, value in tensors.items():
        for pattern, replacement in compiled:
            name = pattern.sub(replacement, name)
        renamed[name] = value
    return renamed


def _some(names: list[str], n: int = 4) -> str:
    return ", ".join(names[:n]) + (f", ... ({len(names) - n} more)" if len(names) > n else "")


def fit_rows(source: Tensor, target: Tensor, name: str, report: ImportReport) -> Tensor:
    """A per-symbol table `[rows, D]` resized to the model's row count: rows past the table's last id
    belong to no symbol and are left out; rows of appended symbols keep the model's fresh values."""
    if source.dim() != target.dim() or tuple(source.shape[1:]) != tuple(target.shape[1:]):
        return source  # reported as a shape mismatch by load_into
    rows = min(source.shape[0], target.shape[0])
    fitted = target.detach().clone()
    fitted[:rows] = source[:rows].to(target.dtype)
    if source.shape[0] > rows:
        report.notes.append(f"{name}: the source's rows {rows}..{source.shape[0] - 1} belong to no symbol of "
                            f"the table and are left out.")
    if target.shape[0] > rows:
        report.notes.append(f"{name}: rows {rows}..{target.shape[0] - 1} (appended symbols) start fresh.")
    return fitted
