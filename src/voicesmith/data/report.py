"""The validation report: every item's verdict, the DESIGN.md JSON and the printed summary."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from voicesmith.data.formats import CorpusItem, Finding
from voicesmith.fileio import atomic_write_json

HISTOGRAM_EDGES = (0, 1, 2, 3, 4, 5, 6, 8, 10, 15, 20, 30)  # seconds; a last bin holds everything longer
TOP_REASONS = 3
EXAMPLES = 5  # excluded items the printed summary shows


@dataclass
class ItemResult:
    """The verdict on one item. `item` is None for a metadata line that could not be parsed."""

    id: str
    line: Optional[int]
    findings: list[Finding] = field(default_factory=list)
    item: Optional[CorpusItem] = None
    seconds: float = 0.0  # usable audio after resampling and trimming
    n_frames: int = 0  # mel frames that audio makes
    ids: list[int] = field(default_factory=list)  # phoneme ids (with Piper's pads, bos, eos)
    n_phonemes: int = 0  # phonemes said (no pads, stress marks, spaces or punctuation)
    speech_seconds: float = 0.0  # the audio with leading and trailing silence trimmed (even when kept)

    @property
    def speaking_rate(self) -> float:
        """Phonemes per second of speech; 0 when either is unknown."""
        return self.n_phonemes / self.speech_seconds if self.n_phonemes and self.speech_seconds else 0.0

    @property
    def excluded(self) -> bool:
        return self.item is None or any(finding.severity == "error" for finding in self.findings)


@dataclass
class ValidationReport:
    dataset: Path
    format: str
    results: list[ItemResult]  # one per item (metadata line), in corpus order
    unlisted_audio: int = 0
    settings_key: str = ""  # hash of the settings and symbol table the verdicts were made with
    checks: dict = field(default_factory=dict)  # corpus-wide checks by name: what they measured, skipped, listed

    @property
    def items_total(self) -> int:
        return len(self.results)

    @property
    def usable(self) -> list[ItemResult]:
        return [result for result in self.results if not result.excluded]

    @property
    def usable_items(self) -> list[CorpusItem]:
        return [result.item for result in self.usable]

    @property
    def items_usable(self) -> int:
        return len(self.usable)

    @property
    def items_excluded(self) -> int:
        return self.items_total - self.items_usable

    @property
    def findings(self) -> list[Finding]:
        return [finding for result in self.results for finding in result.findings]

    @property
    def seconds_usable(self) -> float:
        return sum(result.seconds for result in self.usable)

    def exclude(self, item_id: str, finding: Finding) -> None:
        """Mark a usable item excluded after the fact (e.g. its file changed before preparation)."""
        for result in self.results:
            if result.id == item_id and not result.excluded:
                result.findings.append(finding)
                return
        raise KeyError(item_id)

    def kind_counts(self) -> Counter:
        return Counter((finding.kind, finding.severity) for finding in self.findings)

    def top_reasons(self, n: int = TOP_REASONS) -> list[str]:
        """The most common reasons for exclusion, each with one example message."""
        errors = [finding for finding in self.findings if finding.severity == "error"]
        counts = Counter(finding.kind for finding in errors)
        example = {}
        for finding in errors:
            example.setdefault(finding.kind, finding)
        return [f"{kind}: {count} item(s), e.g. {example[kind].id}: {example[kind].message}"
                for kind, count in counts.most_common(n)]

    def duration_histogram(self) -> list[dict]:
        seconds = [result.seconds for result in self.usable]
        edges = list(HISTOGRAM_EDGES) + [math.inf]
        return [{"from": low, "to": None if high == math.inf else high,
                 "items": sum(low <= s < high for s in seconds)} for low, high in zip(edges, edges[1:])]

    def to_dict(self) -> dict:
        """DESIGN.md's report: `items` holds every finding, `excluded` is the item's verdict."""
        counts = Counter(finding.kind for finding in self.findings)
        return {
            "dataset": str(self.dataset),
            "format": self.format,
            "items_total": self.items_total,
            "items_usable": self.items_usable,
            "items_excluded": self.items_excluded,
            "hours_usable": round(self.seconds_usable / 3600, 4),
            "counts": dict(sorted(counts.items())),
            "unlisted_audio": self.unlisted_audio,
            "duration_histogram": self.duration_histogram(),
            "checks": self.checks,
            "items": [finding.to_dict(result.excluded) for result in self.results for finding in result.findings],
        }

    def save(self, path: Path) -> Path:
        return atomic_write_json(Path(path), self.to_dict(), indent=1)

    def summary(self) -> str:
        """The table printed by `voicesmith validate`: counts per kind, usable hours, durations."""
        lines = [f"Dataset {self.dataset} ({self.format}): {self.items_total} items, "
                 f"{self.items_usable} usable ({self.seconds_usable / 3600:.2f} h of audio), "
                 f"{self.items_excluded} excluded."]
        counts = self.kind_counts()
        if counts:
            lines.append(f"  {'finding':<20} {'severity':<8} {'items':>6}")
            for (kind, severity), count in sorted(counts.items(), key=lambda kv: (kv[0][1], -kv[1], kv[0][0])):
                lines.append(f"  {kind:<20} {severity:<8} {count:>6}")
        excluded = [(result, finding) for result in self.results if result.excluded for finding in result.findings
                    if finding.severity == "error"]
        if excluded:
            lines.append("Excluded items, for example:")
            for result, finding in excluded[:EXAMPLES]:
                where = f" (line {result.line})" if result.line is not None else ""
                lines.append(f"  {result.id}{where}: {finding.kind}: {finding.message}")
            if len(excluded) > EXAMPLES:
                lines.append(f"  ... and {len(excluded) - EXAMPLES} more in the report (--report FILE).")
        if self.unlisted_audio:
            lines.append(f"  {self.unlisted_audio} audio file(s) in the corpus folder are not named by any "
                         f"metadata line (not used).")
        lines.extend(self._histogram_lines())
        lines.extend(line for check in self.checks.values() for line in check.get("summary", []))
        return "\n".join(lines)

    def _histogram_lines(self) -> list[str]:
        bins = self.duration_histogram()
        filled = [i for i, row in enumerate(bins) if row["items"]]
        if not filled:
            return []
        widest = max(row["items"] for row in bins)
        lines = ["Duration of usable items:"]
        for row in bins[filled[0]:filled[-1] + 1]:
            label = f"{row['from']}-{row['to']} s" if row["to"] is not None else f">{row['from']} s"
            bar = "#" * max(1 if row["items"] else 0, round(30 * row["items"] / widest))
            lines.append(f"  {label:>8} {bar:<30} {row['items']}")
        return lines
