"""`voicesmith report RUN_DIR`: the run on one page to look at and listen to, RUN_DIR/report.html.

People judging a voice would rather listen and look than read logs. The page gathers what a run
leaves in its directory (DESIGN.md, "Run directory"):
- curves from logs/metrics.csv: every `loss/<name>` raw and every `loss_weighted/<name>`,
  validation (`val_loss`, `val/<name>`), `lr`, `grad_norm`, and evaluation (`eval/<metric>`);
  the loss names come from the columns, so any model (acoustic, VITS, vocoder) gets its curves;
- skipped and recovered batches by reason (summary.json, logs/skipped_batches.jsonl);
- the data report (data_report.json): items usable and excluded, by kind, with their ids;
- for each samples/step_<N>/ (and samples/best/): the synthesis and the recording side by side
  as audio players, with the mel and alignment picture;
- the config and summary.json.

The page needs no network: the curves are SVG inside it, the audio and pictures are the run's own
files, linked by relative paths, so the page works wherever the run directory is copied. Anything
that cannot be read is said on the page (which file, what is wrong), never left out silently.
Training refreshes the page at every sample step and when it ends.
"""

from __future__ import annotations

import base64
import csv
import html
import io
import json
import logging
import math
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Optional
from urllib.parse import quote

from voicesmith.errors import UserInputError
from voicesmith.fileio import atomic_write

log = logging.getLogger(__name__)

REPORT = "report.html"
MAX_POINTS = 1500  # points per curve in the page; longer series are thinned evenly
MAX_SKIP_ROWS = 100
MAX_IDS_SHOWN = 40


def refresh_report(run_dir: Path, training_step: Optional[int] = None) -> Optional[Path]:
    """write_report for training: a page that cannot be written is logged and never stops the run."""
    try:
        return write_report(run_dir, training_step)
    except Exception as exc:  # noqa: BLE001 - the page is never worth a lost run; said, not hidden
        log.warning("The report page %s could not be refreshed (%s: %s); `voicesmith report %s` tries again.",
                    Path(run_dir) / REPORT, type(exc).__name__, exc, run_dir)
        return None


def report_command(run_dir: Path) -> int:
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise UserInputError(f"{run_dir} is not a folder: give the RUN_DIR that `voicesmith init` made.")
    if not (run_dir / "config.yaml").is_file():
        raise UserInputError(f"{run_dir} has no config.yaml, so it is not a run directory: give the RUN_DIR "
                             f"that `voicesmith init` made (e.g. `voicesmith report runs/my_voice`).")
    path = write_report(run_dir)
    print(f"Wrote {path}\nOpen it in a browser: file://{path.resolve()}")
    return 0


def write_report(run_dir: Path, training_step: Optional[int] = None) -> Path:
    """Write RUN_DIR/report.html atomically and return its path.

    `training_step`: the run is training now, at this step (the page says so instead of showing
    the summary of an earlier exit as the current state).
    """
    run_dir = Path(run_dir)
    page = render(RunFiles.read(run_dir), training_step)
    return atomic_write(run_dir / REPORT, lambda handle: handle.write(page.encode("utf-8")))


# --- reading the run directory -------------------------------------------------------------------------


@dataclass
class Series:
    """One metrics.csv column: (step, value) pairs in step order."""

    steps: list[float] = field(default_factory=list)
    values: list[float] = field(default_factory=list)


@dataclass
class RunFiles:
    """What the run directory holds, and what could not be read (each problem names its file)."""

    run_dir: Path
    config_text: str = ""
    summary: Optional[dict] = None
    data_report: Optional[dict] = None
    metrics: dict[str, Series] = field(default_factory=dict)
    skipped: list[dict] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @classmethod
    def read(cls, run_dir: Path) -> "RunFiles":
        files = cls(run_dir)
        config = run_dir / "config.yaml"
        files.config_text = config.read_text(encoding="utf-8", errors="replace") if config.is_file() else ""
        files.summary = files._json("summary.json")
        files.data_report = files._json("data_report.json")
        files.metrics = files._metrics(run_dir / "logs" / "metrics.csv")
        files.skipped = files._jsonl(run_dir / "logs" / "skipped_batches.jsonl")
        return files

    def _json(self, name: str) -> Optional[dict]:
        path = self.run_dir / name
        if not path.is_file():
            return None
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError) as exc:
            self.problems.append(f"{name} could not be read ({exc}); it is left out of this page.")
            return None

    def _metrics(self, path: Path) -> dict[str, Series]:
        """Every numeric column of metrics.csv by name; empty cells are steps where it was not logged."""
        if not path.is_file():
            return {}
        series: dict[str, Series] = {}
        unreadable = 0
        with open(path, newline="", encoding="utf-8", errors="replace") as handle:
            for row in csv.DictReader(handle):
                step = _number(row.get("step"))
                for name, cell in row.items():
                    if name in (None, "step", "epoch") or cell in (None, ""):
                        continue
                    value = _number(cell)
                    if value is None or step is None:
                        unreadable += 1
                        continue
                    entry = series.setdefault(name, Series())
                    entry.steps.append(step)
                    entry.values.append(value)
        if unreadable:
            self.problems.append(f"{unreadable} cell(s) of logs/metrics.csv are not numbers or have no step; "
                                 f"they are left out of the curves.")
        return series

    def _jsonl(self, path: Path) -> list[dict]:
        if not path.is_file():
            return []
        records, bad_lines = [], []
        for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            if not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except ValueError:
                bad_lines.append(number)
        if bad_lines:
            self.problems.append(f"logs/skipped_batches.jsonl: line(s) {_short_list(bad_lines, 10)} are not JSON "
                                 f"(a run killed mid-write?); they are left out of the table.")
        return records


def _number(text: Optional[str]) -> Optional[float]:
    try:
        value = float(text)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


# --- the page ---------------------------------------------------------------------------------------


def render(files: RunFiles, training_step: Optional[int] = None) -> str:
    sections = [("Overview", overview(files, training_step)), ("Curves", curves(files.metrics)),
                ("Samples", samples(files)), ("Evaluation", evaluation(files.metrics)),
                ("Skipped batches", skipped_batches(files)), ("Data", data_report(files.data_report)),
                ("Config and summary", config_and_summary(files))]
    contents = " · ".join(f'<a href="#{_anchor(title)}">{title}</a>' for title, _ in sections)
    body = "\n".join(f'<section id="{_anchor(title)}"><h2>{title}</h2>\n{content}</section>'
                     for title, content in sections)
    name = html.escape(files.run_dir.resolve().name)
    return (f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<title>voicesmith run {name}</title>\n<style>{STYLE}</style></head>\n"
            f"<body><header><h1>voicesmith run <code>{name}</code></h1><nav>{contents}</nav></header>\n"
            f"{body}\n</body></html>\n")


STYLE = """
body{font:15px/1.45 system-ui,sans-serif;margin:0 auto;max-width:1200px;padding:0 16px 40px;color:#1d1d1f}
h1{font-size:22px;margin:18px 0 4px} h2{font-size:18px;border-bottom:1px solid #ddd;padding-bottom:4px;margin-top:28px}
h3{font-size:15px;margin:16px 0 6px} nav a{margin-right:4px} code,pre{font:13px ui-monospace,monospace}
pre{background:#f6f6f6;padding:10px;overflow:auto;max-height:420px}
table{border-collapse:collapse;margin:6px 0}
td,th{border:1px solid #ddd;padding:4px 8px;text-align:left;vertical-align:top}
th{background:#f3f3f3} .problem{background:#fff4e5;border-left:4px solid #f0a020;padding:6px 10px;margin:6px 0}
.note{color:#666} figure{margin:4px 0} img.curve{max-width:100%;height:auto}
.curves{display:grid;grid-template-columns:repeat(auto-fill,minmax(520px,1fr));gap:4px 12px}
img.sample{max-width:520px;width:100%;height:auto} audio{width:260px}
.kv td:first-child{font-weight:600;white-space:nowrap} details{margin:6px 0} summary{cursor:pointer}
"""


def _anchor(title: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")


def overview(files: RunFiles, training_step: Optional[int]) -> str:
    summary = files.summary or {}
    rows: list[tuple[str, str]] = []
    if training_step is not None:
        rows.append(("status", f"training, at step {training_step} (this page is refreshed at every sample step "
                               f"and when the run ends)"))
    elif summary:
        rows.append(("status", f"{summary.get('status')}: {summary.get('reason')}"))
    else:
        rows.append(("status", "no summary.json yet: this run has not trained (run `voicesmith train`)"))
    if summary:
        limit = summary.get("max_steps")
        rows.append(("steps", f"{summary.get('global_step')}" + (f" of {limit}" if limit and limit > 0 else "")
                     + (" (as of the last exit)" if training_step is not None else "")))
        rows.append(("items", f"{summary.get('items_used')} used, {summary.get('items_excluded')} excluded"))
        rows.append(("device", f"{summary.get('device')}, precision {summary.get('precision')}"))
        if summary.get("best_score") is not None:
            rows.append(("best", f"{summary.get('best_metric')} {summary['best_score']:.4g} "
                                 f"({summary.get('best_checkpoint')})"))
    rows.append(("written", time.strftime("%Y-%m-%d %H:%M:%S %Z") + f" from {files.run_dir}"))
    links = " · ".join(_link(name) for name in ("config.yaml", "summary.json", "data_report.json", "logs/train.log",
                                                "logs/metrics.csv") if (files.run_dir / name).is_file())
    problems = "".join(f'<p class="problem">{html.escape(problem)}</p>' for problem in files.problems)
    return problems + _table([(key, html.escape(str(value))) for key, value in rows] + [("files", links)])


def curves(metrics: dict[str, Series]) -> str:
    if not metrics:
        return '<p class="note">No logs/metrics.csv yet (it is written while training when logging.csv is on).</p>'
    weighted = _columns(metrics, "loss_weighted/")
    groups = [
        ("Losses, raw", _columns(metrics, "loss/")),
        ("Losses, weighted (they add up to the total)", (["loss/total"] if weighted and "loss/total" in metrics
                                                         else []) + weighted),
        ("Validation", [name for name in ("val_loss",) if name in metrics] + _columns(metrics, "val/")),
        ("Learning rate", [name for name in ("lr",) if name in metrics]),
        ("Gradient norm (before clipping)", [name for name in ("grad_norm",) if name in metrics]),
    ]
    labels = sorted({_label(name) for _, names in groups for name in names},
                    key=lambda label: (label != "total", label))
    colours = {label: f"C{index % 10}" for index, label in enumerate(labels)}  # a loss keeps its colour throughout
    parts = [_figure(title, {_label(name): metrics[name] for name in names}, log_scale=title.startswith("Loss"),
                     colours=colours) for title, names in groups if names]
    if not parts:
        return '<p class="note">metrics.csv has no loss columns yet.</p>'
    return '<div class="curves">' + "\n".join(parts) + "</div>"


def _columns(metrics: dict[str, Series], prefix: str) -> list[str]:
    """The columns under `prefix`, the total first: its line is the one to read."""
    names = sorted(name for name in metrics if name.startswith(prefix))
    return sorted(names, key=lambda name: name != f"{prefix}total")


def _label(name: str) -> str:
    return name.split("/", 1)[1] if "/" in name else name


def evaluation(metrics: dict[str, Series]) -> str:
    names = _columns(metrics, "eval/")
    if not names:
        return ('<p class="note">No evaluation during training (set eval.every_n_steps, or run '
                '<code>voicesmith eval RUN_DIR</code>).</p>')
    plots = ('<div class="curves">' + "\n".join(_figure(_label(name), {_label(name): metrics[name]}, log_scale=False)
                                               for name in names) + "</div>")
    steps = sorted({step for name in names for step in metrics[name].steps})
    table = [[f"{step:g}", *(_value_at(metrics[name], step) for name in names)] for step in steps]
    return plots + _grid(["step", *(_label(name) for name in names)], table)


def _value_at(series: Series, step: float) -> str:
    return next((f"{value:.4g}" for at, value in zip(series.steps, series.values) if at == step), "")


def skipped_batches(files: RunFiles) -> str:
    summary = files.summary or {}
    counts = [(reason, count, "skipped") for reason, count in (summary.get("batches_skipped") or {}).items()]
    counts += [(reason, count, "recovered") for reason, count in (summary.get("batches_recovered") or {}).items()]
    records = files.skipped
    if not counts and records:  # training now: no summary yet, count the records themselves
        tally: dict[tuple[str, str], int] = {}
        for record in records:
            key = (record.get("reason", "?"), record.get("kind", "skipped"))
            tally[key] = tally.get(key, 0) + 1
        counts = [(reason, count, kind) for (reason, kind), count in tally.items()]
    if not counts:
        return "<p>No batch was skipped or recovered.</p>"
    parts = [_grid(["reason", "batches", "what happened"],
                   [[reason, str(count), kind] for reason, count, kind in counts])]
    if records:
        rows = [[str(record.get("step", "")), record.get("kind", ""), record.get("reason", ""),
                 _short_list(record.get("ids", []), 8), record.get("detail", "")] for record in records[:MAX_SKIP_ROWS]]
        more = (f" The first {MAX_SKIP_ROWS} of {len(records)} are shown; all are in "
                f"{_link('logs/skipped_batches.jsonl')}." if len(records) > MAX_SKIP_ROWS else "")
        parts.append(f"<h3>Each batch, with its items</h3><p class=\"note\">{more}</p>"
                     + _grid(["step", "kind", "reason", "items", "detail"], rows))
    return "\n".join(parts)


def data_report(report: Optional[dict]) -> str:
    if report is None:
        return '<p class="note">No data_report.json yet (training and <code>voicesmith prepare</code> write it).</p>'
    total, usable = report.get("items_total", 0), report.get("items_usable", 0)
    head = (f"<p>{html.escape(str(report.get('dataset', '')))}: <b>{usable}</b> of {total} items usable, "
            f"<b>{total - usable}</b> excluded; {report.get('hours_usable') or 0:g} h of usable audio.</p>")
    groups: dict[tuple[str, str], list[dict]] = {}
    for item in report.get("items", []):
        groups.setdefault((item.get("severity", "?"), item.get("kind", "?")), []).append(item)
    if not groups:
        return head + "<p>No item has a finding.</p>"
    rows = []
    for (severity, kind), items in sorted(groups.items(), key=lambda entry: (entry[0][0] != "error", entry[0][1])):
        effect = "excluded" if severity == "error" else "kept (warning)"
        ids = [str(item.get("id")) for item in items]
        rows.append([kind, effect, str(len(items)), _ids_cell(ids), html.escape(str(items[0].get("message", "")))])
    return head + _grid(["kind", "effect", "items", "ids", "example"], rows, escape=False)


def _ids_cell(ids: list[str]) -> str:
    shown = html.escape(", ".join(ids[:MAX_IDS_SHOWN]))
    if len(ids) <= MAX_IDS_SHOWN:
        return shown
    more = len(ids) - MAX_IDS_SHOWN
    return f"<details><summary>{shown} … (+{more})</summary>{html.escape(', '.join(ids))}</details>"


def samples(files: RunFiles) -> str:
    folders = sample_folders(files.run_dir / "samples")
    if not folders:
        return '<p class="note">No samples yet (written every samples.every_n_steps steps).</p>'
    texts = _sample_texts(files.config_text)
    parts = []
    for index, folder in enumerate(folders):
        title = "Best so far" if folder.name == "best" else f"Step {folder.name.removeprefix('step_')}"
        table = _sample_table(files.run_dir, folder, texts)
        if index < 2:  # the best and the newest open; older steps fold away but stay one click from here
            parts.append(f"<h3>{title}</h3>{table}")
        else:
            parts.append(f"<details><summary>{title}</summary>{table}</details>")
    return ('<p class="note">Each row: what the model says, the recording it learns from (validation items), '
            'and the mel spectrograms with the alignment. Listen from the oldest step to the newest.</p>'
            + "\n".join(parts))


def sample_folders(samples_dir: Path) -> list[Path]:
    """samples/best first, then samples/step_<N> from the newest step down."""
    if not samples_dir.is_dir():
        return []
    steps = [folder for folder in samples_dir.iterdir() if folder.is_dir() and re.fullmatch(r"step_\d+", folder.name)]
    steps.sort(key=lambda folder: int(folder.name.removeprefix("step_")), reverse=True)
    best = samples_dir / "best"
    return ([best] if best.is_dir() and any(best.glob("*.wav")) else []) + steps


def _sample_table(run_dir: Path, folder: Path, texts: dict[str, str]) -> str:
    rows = []
    for wav in sorted(path for path in folder.glob("*.wav") if not path.stem.endswith("_reference")):
        stem = html.escape(wav.stem)
        reference, picture = folder / f"{wav.stem}_reference.wav", folder / f"{wav.stem}.png"
        name = stem + (f'<br><span class="note">{html.escape(texts[wav.stem])}</span>' if wav.stem in texts else "")
        recording = (_audio(run_dir, reference) if reference.is_file()
                     else '<span class="note">(a text: no recording)</span>')
        image = (f'<img class="sample" src="{_href(run_dir, picture)}" alt="mel and alignment of {stem}">'
                 if picture.is_file() else '<span class="note">no picture</span>')
        rows.append([name, _audio(run_dir, wav), recording, image])
    if not rows:
        return '<p class="note">No sample in this folder (see logs/train.log for why).</p>'
    return _grid(["sample", "synthesis", "recording", "mel and alignment"], rows, escape=False)


def _sample_texts(config_text: str) -> dict[str, str]:
    """sample-01, sample-02, ... -> the samples.texts they speak (the names samples.py gives them)."""
    import yaml

    try:
        texts = (yaml.safe_load(config_text) or {}).get("samples", {}).get("texts", [])
    except yaml.YAMLError:
        return {}
    return {f"sample-{index + 1:02d}": str(text) for index, text in enumerate(texts or [])}


def _audio(run_dir: Path, path: Path) -> str:
    return f'<audio controls preload="metadata" src="{_href(run_dir, path)}"></audio>'


def config_and_summary(files: RunFiles) -> str:
    summary = json.dumps(files.summary, indent=2, ensure_ascii=False) if files.summary else "(no summary.json yet)"
    return (f"<h3>summary.json</h3><pre>{html.escape(summary)}</pre>"
            f"<h3>config.yaml</h3><pre>{html.escape(files.config_text)}</pre>")


# --- pieces ------------------------------------------------------------------------------------------


def _figure(title: str, lines: dict[str, Series], log_scale: bool, colours: Optional[dict[str, str]] = None) -> str:
    """A curve plot as an inline SVG picture (an <img> with a data: URI: no network, no id clashes)."""
    from matplotlib import rc_context
    from matplotlib.backends.backend_svg import FigureCanvasSVG
    from matplotlib.figure import Figure

    figure = Figure(figsize=(6, 3.2))
    FigureCanvasSVG(figure)
    axes = figure.add_subplot(1, 1, 1)
    positive = all(value > 0 for series in lines.values() for value in series.values)
    for label, series in lines.items():
        steps, values = _thin(series.steps, MAX_POINTS), _thin(series.values, MAX_POINTS)
        width, colour = (2.0 if label == "total" else 1.2), (colours or {}).get(label)
        if len(values) > 60:  # noisy per-step values: the trend solid, the raw values faint behind it
            line, = axes.plot(steps, values, linewidth=0.6, alpha=0.3, color=colour)
            axes.plot(steps, _moving_average(values, max(3, len(values) // 40)), linewidth=width,
                      color=line.get_color(), label=label)
        else:
            axes.plot(steps, values, linewidth=width, marker="o" if len(values) < 20 else None, markersize=3,
                      label=label, color=colour)
    if log_scale and positive:
        axes.set_yscale("log")
    axes.set_xlabel("step")
    axes.grid(True, alpha=0.3)
    if len(lines) > 1:
        axes.legend(fontsize=8, loc="upper right", ncol=min(4, len(lines)))
    axes.set_title(title, fontsize=11)
    figure.tight_layout()
    buffer = io.BytesIO()
    with rc_context({"svg.fonttype": "none"}):  # text stays text: smaller, and the labels can be searched
        figure.savefig(buffer, format="svg")
    data = base64.b64encode(buffer.getvalue()).decode("ascii")
    return (f'<figure><img class="curve" width="600" height="320" alt="{html.escape(title)}" '
            f'src="data:image/svg+xml;base64,{data}"></figure>')


def _thin(values: list[float], limit: int) -> list[float]:
    if len(values) <= limit:
        return values
    stride = len(values) / limit
    return [values[int(index * stride)] for index in range(limit - 1)] + [values[-1]]


def _moving_average(values: list[float], window: int) -> list[float]:
    """Trailing mean over `window` points (fewer at the start), so the line starts where the data does."""
    sums, total, out = [], 0.0, []
    for value in values:
        total += value
        sums.append(total)
    for index in range(len(values)):
        start = max(0, index - window + 1)
        out.append((sums[index] - (sums[start - 1] if start else 0.0)) / (index - start + 1))
    return out


def _href(run_dir: Path, path: Path) -> str:
    return quote(path.relative_to(run_dir).as_posix())


def _link(name: str) -> str:
    return f'<a href="{quote(name)}">{html.escape(name)}</a>'


def _short_list(values: Iterable[Any], limit: int) -> str:
    values = [str(value) for value in values]
    return ", ".join(values[:limit]) + (f" (+{len(values) - limit} more)" if len(values) > limit else "")


def _table(rows: list[tuple[str, str]]) -> str:
    """Key/value rows; the values are HTML already."""
    body = "".join(f"<tr><td>{html.escape(key)}</td><td>{value}</td></tr>" for key, value in rows)
    return f'<table class="kv">{body}</table>'


def _grid(header: list[str], rows: list[list[str]], escape: bool = True) -> str:
    head = "".join(f"<th>{html.escape(name)}</th>" for name in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(cell) if escape else cell}</td>" for cell in row) + "</tr>"
                   for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"
