"""The model as a last check: the items a trained voice finds hardest, and alignments that cannot be right.

A transcript that does not match its audio is learned badly: the model's loss on it stays high, and the
alignment it finds squeezes phonemes the audio does not hold into single frames, or lets one phoneme
hold the audio the transcript does not mention. `voicesmith validate DATA --with-model RUN` runs the
run's model over every item of its feature cache, one item per batch (so each loss is that item's own),
and lists the worst by loss and by alignment.

Any model works whose `forward(batch)` takes the loader's batch and returns an object with `.losses`
(name -> scalar tensor) and `.alignment` ([B, T_text, T_mel], a hard or soft path): the acoustic model
and the VITS model do. The per-item loss weighs the components with the run's `model.loss_weights`.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from voicesmith.errors import UserInputError

CHECK = "model"
WORST = 10
SQUEEZED_FRAMES = 1  # a phoneme given this many frames or fewer is squeezed


@dataclass
class ItemScore:
    """How one cached item fares under the model."""

    id: str
    text: str
    loss: float  # weighted sum of the model's losses on this item alone
    losses: dict[str, float]
    max_share: float  # the largest share of the item's frames that one id holds
    squeezed: float  # share of the phonemes given at most SQUEEZED_FRAMES frames (with the pads after them)

    @property
    def implausibility(self) -> float:
        """0 for an even alignment, near 1 when one id holds the clip or nearly every phoneme is squeezed."""
        return max(self.max_share, self.squeezed)

    def to_dict(self) -> dict:
        return {"id": self.id, "text": self.text, "loss": round(self.loss, 4),
                "losses": {name: round(value, 4) for name, value in self.losses.items()},
                "max_share": round(self.max_share, 3), "squeezed": round(self.squeezed, 3),
                "implausibility": round(self.implausibility, 3)}


def alignment_scores(alignment, phoneme_mask) -> tuple[float, float]:
    """(max_share, squeezed) of one item's alignment `[T_text, T_mel]` (cropped to its lengths).

    `phoneme_mask` `[T_text]` (bool) marks the ids that are sounds. The ids after a sound up to the next
    one (Piper's interspersed pads, word breaks, punctuation) count with it: they hold its transitions.
    """
    import torch

    durations = alignment.float().sum(-1)
    max_share = float(durations.max() / alignment.shape[-1])
    owner = torch.cumsum(phoneme_mask.long(), 0)  # 0 for the ids before the first sound
    per_sound = torch.zeros(int(owner.max()) + 1).index_add_(0, owner, durations)[1:]
    squeezed = float((per_sound <= SQUEEZED_FRAMES).float().mean()) if per_sound.numel() else 0.0
    return max_share, squeezed


def score_items(run_dir: Path, device: str = "cpu", progress: bool = False) -> list[ItemScore]:
    """Every item of the run's feature cache scored by the run's model (best.ckpt, else last.ckpt)."""
    import torch

    from voicesmith.data.cache import FeatureCache
    from voicesmith.data.loader import TTSDataset, collate_batch
    from voicesmith.inference import Synthesizer, evaluating, single_threaded_on_cpu

    synth = Synthesizer.load(run_dir, device=device, vocoder="griffin-lim")  # the vocoder is not needed
    if not isinstance(synth, Synthesizer):
        raise UserInputError(f"{run_dir} is an ONNX voice; --with-model needs the training run (or its checkpoint), "
                             f"whose model computes losses and alignments.")
    config = synth.config
    cache = FeatureCache.load(config.resolve(config.data.cache_dir))
    if cache.symbols != synth.symbols:
        raise UserInputError(f"The feature cache {cache.root} was made with another symbol table than the model in "
                             f"{run_dir}; run `voicesmith prepare {config.path}` again.")
    dataset = TTSDataset(cache.root, cache.entries, config.audio.hop_length)
    first_phoneme = _first_phoneme_id()
    scores = []
    with evaluating(synth.model), single_threaded_on_cpu(torch.device(device)):
        for index in _progress(range(len(dataset)), progress):
            batch = _to(collate_batch([dataset[index]]), device)
            scores.append(_score(synth.model(batch), batch, config.model.loss_weights, first_phoneme))
    return scores


def _score(output, batch: dict, weights, first_phoneme: int) -> ItemScore:
    n_ids, n_frames = int(batch["phoneme_lengths"][0]), int(batch["mel_lengths"][0])
    losses = {name: float(value.detach()) for name, value in output.losses.items()}
    loss = sum(getattr(weights, name, 1.0) * value for name, value in losses.items())
    alignment = _oriented(output.alignment[0], n_ids, n_frames)[:n_ids, :n_frames]
    ids = batch["phoneme_ids"][0, :n_ids]
    max_share, squeezed = alignment_scores(alignment.cpu(), (ids >= first_phoneme).cpu())
    return ItemScore(batch["ids"][0], batch["texts"][0], loss, losses, max_share, squeezed)


def _oriented(alignment, n_ids: int, n_frames: int):
    """[T_text, T_mel] from a model's alignment of one item ([1, T_text, T_mel] and [T_mel, T_text] too)."""
    while alignment.dim() > 2 and alignment.shape[0] == 1:
        alignment = alignment[0]
    if alignment.dim() == 2 and alignment.shape[0] >= n_ids and alignment.shape[1] >= n_frames:
        return alignment
    if alignment.dim() == 2 and alignment.shape[1] >= n_ids and alignment.shape[0] >= n_frames:
        return alignment.transpose(0, 1)
    raise UserInputError(f"The model's alignment has shape {tuple(alignment.shape)}, which fits neither "
                         f"{n_ids} ids x {n_frames} frames nor the reverse; this model cannot be used with "
                         f"--with-model.")


def _first_phoneme_id() -> int:
    """Ids below this are pad, begin, end, word break and punctuation (Piper's reserved ids)."""
    from voicesmith.text.symbols import RESERVED

    return len(RESERVED)


def _to(batch: dict, device: str) -> dict:
    return {key: value.to(device) if hasattr(value, "to") else value for key, value in batch.items()}


def _progress(items, enabled: bool):
    if not enabled:
        return items
    from tqdm import tqdm

    return tqdm(items, desc="scoring with the model", unit="item", file=sys.stderr, leave=False)


def model_check(report, run_dir: Path, worst: int = WORST, device: str = "cpu", progress: bool = False) -> dict:
    """The `--with-model` record for a validation report: the worst items by loss and by alignment.

    Items of the run's cache that the report does not hold are counted (the run was prepared from
    other data); none in common is an error.
    """
    scores = score_items(run_dir, device, progress)
    known = {result.id: result for result in report.results}
    shared = [score for score in scores if score.id in known]
    if scores and not shared:
        raise UserInputError(f"None of the {len(scores)} items the run {run_dir} was prepared from is in "
                             f"{report.dataset}; pass the run's own dataset.")
    by_loss = sorted(shared, key=lambda score: -score.loss)[:worst]
    by_alignment = sorted(shared, key=lambda score: -score.implausibility)[:worst]
    lines = [f"Model check ({run_dir}): {len(shared)} items scored one at a time"
             + (f" ({len(scores) - len(shared)} cached items not in this dataset, left out)."
                if len(scores) > len(shared) else ".")]
    lines += _list_lines("Highest loss", by_loss, known, lambda s: f"loss {s.loss:.3f}")
    lines += _list_lines("Least plausible alignment", by_alignment, known,
                         lambda s: f"one id holds {s.max_share:.0%} of the frames, {s.squeezed:.0%} of the "
                                   f"phonemes squeezed into <= {SQUEEZED_FRAMES} frame")
    return {"run": str(run_dir), "items": len(shared), "not_in_dataset": len(scores) - len(shared),
            "worst_loss": [score.to_dict() for score in by_loss],
            "worst_alignment": [score.to_dict() for score in by_alignment], "summary": lines}


def _list_lines(title: str, scores: list[ItemScore], known: dict, describe) -> list[str]:
    lines = [f"{title}:"] if scores else []
    for score in scores:
        flagged = sorted({finding.kind for finding in known[score.id].findings})
        note = f"  [validation: {', '.join(flagged)}]" if flagged else ""
        lines.append(f"  {score.id}: {describe(score)}{note}\n      {score.text}")
    return lines
