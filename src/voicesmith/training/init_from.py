"""`train.init_from`: start a run from another voice's weights, matched by meaning, not by position.

A base voice and a new corpus rarely share a symbol table or a speaker list: the new data may use
phonemes the base never saw, or the same ones in another order. Rows of symbol and speaker tables
are therefore copied by symbol and by speaker name; new symbols and speakers keep fresh rows. Every
other tensor is copied when its name and shape agree. Shapes that differ are reported layer by layer
with what to do, never as a raw state_dict error. The optimizer and the step are not taken.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Optional

import torch
from torch import Tensor, nn

from voicesmith.checkpoint import model_state
from voicesmith.errors import ConfigError
from voicesmith.text import SymbolTable

log = logging.getLogger(__name__)


@dataclass
class WarmStart:
    """What `init_from` took from the base voice."""

    copied: int = 0
    fresh: list[str] = field(default_factory=list)  # tensors the base voice lacks (kept as initialised)
    ignored: list[str] = field(default_factory=list)  # tensors of the base voice this model has no use for
    symbols_shared: int = 0
    symbols_new: list[str] = field(default_factory=list)
    speakers_shared: int = 0
    speakers_new: list[str] = field(default_factory=list)

    def describe(self, source: Path) -> str:
        lines = [f"Started from the weights of {source}: {self.copied} tensors copied; "
                 f"{self.symbols_shared} symbols mapped by symbol"
                 + (f", {len(self.symbols_new)} new with fresh rows ({' '.join(self.symbols_new)})"
                    if self.symbols_new else "")]
        if self.speakers_shared or self.speakers_new:
            lines.append(f"speakers: {self.speakers_shared} mapped by name"
                         + (f", new: {', '.join(self.speakers_new)}" if self.speakers_new else ""))
        if self.fresh:
            lines.append(f"{len(self.fresh)} tensors the base voice lacks start fresh: {_some(self.fresh)}")
        if self.ignored:
            lines.append(f"{len(self.ignored)} tensors of the base voice are not used: {_some(self.ignored)}")
        return "\n  ".join(lines)


def warm_start(model: nn.Module, ckpt: Mapping, symbols: Optional[SymbolTable], speakers: Mapping[str, int],
               model_type: str, source: Path) -> WarmStart:
    """Load the base checkpoint's weights into `model` (whose tables are `symbols` and `speakers`;
    None: the base voice's own table)."""
    block = ckpt.get("voicesmith", {})
    if block.get("model_type", model_type) != model_type:
        raise ConfigError(f"train.init_from={source} holds a {block.get('model_type')} model, but this run trains "
                          f"a {model_type} model; start from a {model_type} checkpoint.")
    base_state = model_state(ckpt)
    base_symbols = SymbolTable.from_dict(block["symbols"]) if "symbols" in block else symbols
    symbols = symbols or base_symbols
    base_speakers = block.get("speakers", {})
    symbol_rows = _row_pairs(symbols.phoneme_id_map, base_symbols.phoneme_id_map)
    speaker_rows = _row_pairs({name: [i] for name, i in speakers.items()},
                              {name: [i] for name, i in base_speakers.items()})
    by_symbol, by_speaker = set(getattr(model, "symbol_tables", ())), set(getattr(model, "speaker_tables", ()))
    report, state, mismatched = WarmStart(), model.state_dict(), []
    for name, tensor in state.items():
        if name not in base_state:
            report.fresh.append(name)
            continue
        base = base_state[name]
        if name in by_symbol or name in by_speaker:
            if base.shape[1:] != tensor.shape[1:]:
                mismatched.append((name, base.shape, tensor.shape))
                continue
            state[name] = _copy_rows(tensor, base, symbol_rows if name in by_symbol else speaker_rows)
        elif base.shape != tensor.shape:
            mismatched.append((name, base.shape, tensor.shape))
            continue
        else:
            state[name] = base.to(tensor.dtype)
        report.copied += 1
    if mismatched:
        raise ConfigError(_mismatch_message(source, mismatched, block))
    model.load_state_dict(state)
    report.ignored = sorted(set(base_state) - set(state))
    report.symbols_shared = sum(1 for symbol in symbols.phoneme_id_map if symbol in base_symbols.phoneme_id_map)
    report.symbols_new = [s for s in symbols.phoneme_id_map if s not in base_symbols.phoneme_id_map]
    report.speakers_shared = sum(1 for name in speakers if name in base_speakers)
    report.speakers_new = [name for name in speakers if name not in base_speakers] if base_speakers else []
    return report


def _row_pairs(target: Mapping[str, list[int]], base: Mapping[str, list[int]]) -> list[tuple[int, int]]:
    """(target row, base row) for every key both tables hold."""
    return [(t, b) for key, ids in target.items() if key in base
            for t, b in zip(ids, base[key])]


def _copy_rows(tensor: Tensor, base: Tensor, pairs: list[tuple[int, int]]) -> Tensor:
    result = tensor.clone()
    pairs = [(t, b) for t, b in pairs if t < tensor.shape[0] and b < base.shape[0]]
    if pairs:
        target_rows, base_rows = (torch.tensor(rows) for rows in zip(*pairs))
        result[target_rows] = base[base_rows].to(tensor.dtype)
    return result


def _mismatch_message(source: Path, mismatched: list, block: Mapping) -> str:
    lines = [f"train.init_from={source}: {len(mismatched)} layer(s) of the base voice have other shapes than "
             f"this run's model:"]
    lines += [f"  - {name}: base voice {list(base)}, this run {list(mine)}" for name, base, mine in mismatched[:12]]
    if len(mismatched) > 12:
        lines.append(f"  - ... and {len(mismatched) - 12} more")
    preset = block.get("config", {}).get("preset")
    lines.append("The model section of this run's config must describe the base voice's architecture"
                 + (f" (it was trained with preset {preset!r}: `voicesmith init DATA RUN --preset {preset}` "
                    f"and the same model.* values)." if preset else "."))
    return "\n".join(lines)


def _some(names: list[str], n: int = 5) -> str:
    return ", ".join(names[:n]) + (f", ... ({len(names) - n} more)" if len(names) > n else "")
