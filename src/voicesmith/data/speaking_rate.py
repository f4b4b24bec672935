"""Speaking-rate outliers: a transcript that does not fit its audio speaks impossibly fast or slow.

A truncated transcript, a line of another clip or a placeholder gives a rate (phonemes per second of
speech, silence trimmed) far from what the same speaker does everywhere else. Each speaker is judged
against their own median, in the log domain (twice as fast and half as fast are equally far), with
the median absolute deviation as the yardstick because the outliers themselves must not widen it.
The deviation has a floor (`data.rate_min_spread`): a synthetic or very even corpus would otherwise
flag rates a few percent apart.
"""

from __future__ import annotations

import math
from collections import defaultdict
from statistics import median

from voicesmith.config import DataConfig
from voicesmith.data.formats import Finding
from voicesmith.data.report import ItemResult

MAD_TO_SIGMA = 1.4826  # MAD of a normal distribution times this is its standard deviation
CHECK = "speaking_rate"


def check_speaking_rate(results: list[ItemResult], data: DataConfig) -> dict:
    """Add `text_audio_mismatch` errors and `speaking_rate` warnings to usable items; returns the check's record.

    Only items still usable are judged (an item already excluded has no trustworthy rate), each
    against its own speaker. A speaker with fewer than `data.rate_min_items` usable items is
    skipped and the record says so.
    """
    groups: dict[str, list[ItemResult]] = defaultdict(list)
    for result in results:
        if not result.excluded and result.speaking_rate > 0:
            groups[result.item.speaker].append(result)
    speakers, skipped = {}, {}
    for speaker, members in sorted(groups.items()):
        if len(members) < data.rate_min_items:
            skipped[speaker] = len(members)
            continue
        speakers[speaker] = _judge(members, data)
    return {"speakers": speakers, "skipped_speakers": skipped, "summary": _summary_lines(speakers, skipped, data)}


def _judge(members: list[ItemResult], data: DataConfig) -> dict:
    log_rates = [math.log(result.speaking_rate) for result in members]
    centre = median(log_rates)
    spread = max(MAD_TO_SIGMA * median(abs(value - centre) for value in log_rates), data.rate_min_spread)
    median_rate = math.exp(centre)
    flagged = {"errors": 0, "warnings": 0}
    for result, value in zip(members, log_rates):
        deviations = (value - centre) / spread
        if abs(deviations) > data.rate_outlier_mad:
            result.findings.append(_finding(result, "error", "text_audio_mismatch", deviations, median_rate, data))
            flagged["errors"] += 1
        elif abs(deviations) > data.rate_warning_mad:
            result.findings.append(_finding(result, "warning", CHECK, deviations, median_rate, data))
            flagged["warnings"] += 1
    return {"items": len(members), "median_rate": round(median_rate, 2), "spread": round(spread, 4), **flagged}


def _finding(result: ItemResult, severity: str, kind: str, deviations: float, median_rate: float,
             data: DataConfig) -> Finding:
    who = f"speaker {result.item.speaker}" if result.item.speaker else "this corpus"
    limit = data.rate_outlier_mad if severity == "error" else data.rate_warning_mad
    if deviations < 0:
        cause = "the transcript says less than the audio (truncated, or the text of a shorter clip?)"
    else:
        cause = "the transcript says more than the audio (the text of a longer clip, or the audio cut short?)"
    return Finding(result.id, result.line, severity, kind,
                   f"{result.speaking_rate:.1f} phonemes per second of speech ({result.n_phonemes} phonemes in "
                   f"{result.speech_seconds:.2f} s) against a median of {median_rate:.1f} for {who}, "
                   f"{deviations:+.1f} robust deviations (limit {limit:g}): {cause}. Listen to the clip and correct "
                   f"the text.")


def _summary_lines(speakers: dict[str, dict], skipped: dict[str, int], data: DataConfig) -> list[str]:
    lines = []
    for speaker, record in speakers.items():
        who = f"speaker {speaker}" if speaker else "all items"
        lines.append(f"Speaking rate, {who}: median {record['median_rate']:.1f} phonemes/s over "
                     f"{record['items']} items; {record['errors']} excluded, {record['warnings']} warned.")
    for speaker, count in skipped.items():
        who = f"speaker {speaker}" if speaker else "this corpus"
        lines.append(f"Speaking rate not checked for {who}: {count} usable item(s), the check needs "
                     f"data.rate_min_items = {data.rate_min_items}.")
    return lines
