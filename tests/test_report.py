"""`voicesmith report`: the page of a real short run (tiny acoustic model on a corpus with broken items
and one non-finite batch), its contents, its refresh during training, and headless Chromium opening it."""

from __future__ import annotations

import base64
import json
import logging
import re
import shutil
from pathlib import Path

import pytest
import soundfile as sf
from lightning.pytorch.callbacks import Callback

from chromium_helpers import Browser, browser, chromium_or_skip
from data_corpus_helpers import EXPECTED, make_broken_corpus
from voicesmith.cli import main
from voicesmith.config import apply_override, preset_dict, validate_config
from voicesmith.report import REPORT, RunFiles, refresh_report, write_report
from voicesmith.training import train

ARTIFACTS = Path(__file__).parent / "artifacts"  # ignored by git: the screenshot a person can look at
RUN = ["train.batch_size=4", "data.num_workers=0", "train.warmup_steps=0", "logging.progress_bar=false",
       "logging.log_every_n_steps=1", "train.val_every_n_steps=2", "train.checkpoint_every_n_steps=1000",
       "samples.every_n_steps=2", "samples.on_best=false", "samples.n_references=1", "samples.griffin_lim_iters=4",
       "samples.texts=['Hello there.']"]
STEPS = 4


class NonFiniteOnce(Callback):
    """The second training batch gets a NaN loss, so the run skips one batch for a real reason."""

    def __init__(self):
        self.batches = 0

    def on_train_start(self, trainer, pl_module) -> None:
        model, forward = pl_module.model, pl_module.model.forward

        def forward_with_a_nan(batch):
            output = forward(batch)
            if model.training and self.batches == 2:
                output.losses["mel"] = output.losses["mel"] * float("nan")
            return output

        model.forward = forward_with_a_nan

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.batches += 1


class ReportWatcher(Callback):
    """Reads report.html as training goes: the page must follow the sample steps."""

    def __init__(self, run_dir: Path):
        self.run_dir, self.pages = run_dir, {}

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        page = self.run_dir / REPORT
        if page.is_file():
            self.pages[trainer.global_step] = page.read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def short_run(tmp_path_factory) -> tuple[Path, ReportWatcher]:
    root = tmp_path_factory.mktemp("report_run")
    corpus = make_broken_corpus(root / "corpus", root / "scratch")
    raw = preset_dict("tiny", str(corpus))
    for item in RUN:
        apply_override(raw, item)
    config = validate_config(raw, source="test")
    config.save(root / "run" / "config.yaml")
    watcher = ReportWatcher(config.run_dir)
    summary = train(config, max_steps=STEPS, callbacks=[NonFiniteOnce(), watcher])
    assert summary["status"] == "completed" and summary["batches_skipped"] == {"nonfinite_loss": 1}
    return config.run_dir, watcher


@pytest.fixture(scope="module")
def page(short_run) -> str:
    """The page the run left when it ended."""
    return (short_run[0] / REPORT).read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def chromium(tmp_path_factory) -> Browser:
    binary = chromium_or_skip()
    with browser(binary, tmp_path_factory.mktemp("chromium_profile")) as opened:
        yield opened


def section(page: str, anchor: str) -> str:
    return re.search(rf'<section id="{anchor}">(.*?)</section>', page, re.S).group(1)


def svg_texts(fragment: str) -> list[str]:
    """The text of each inline SVG picture in `fragment` (legends and titles are text, not paths)."""
    return [base64.b64decode(data).decode("utf-8") for data in re.findall(r"data:image/svg\+xml;base64,([^\"]+)",
                                                                           fragment)]


def test_training_refreshes_the_report_at_sample_steps_and_at_the_end(short_run, page):
    during = short_run[1].pages[3]  # written by the samples of step 2, read one step later
    assert "training, at step 2" in during and "samples/step_2/sample-01.wav" in during
    assert "samples/step_4/" not in during
    assert f"completed: reached max_steps={STEPS}" in page and "samples/step_4/sample-01.wav" in page


def test_report_shows_curves_from_whatever_loss_columns_exist(short_run, page):
    metrics = RunFiles.read(short_run[0]).metrics
    names = sorted(name.removeprefix("loss/") for name in metrics if name.startswith("loss/"))
    assert names == ["duration", "mel", "prior", "total"]  # what this model logged, read back from metrics.csv
    pictures = svg_texts(section(page, "curves"))
    titles = ["Losses, raw", "Losses, weighted", "Validation", "Learning rate", "Gradient norm"]
    assert [next(t for t in titles if t in svg) for svg in pictures] == titles
    assert all(f">{name}<" in pictures[0] for name in names)
    assert all(f">{name}<" in pictures[2] for name in ("val_loss", "mel", "prior", "duration"))


def test_report_derives_gan_curves_from_the_columns(tmp_path):
    """A VITS run logs other losses: the page takes its curves from the columns it finds."""
    losses = ["mel", "kl", "duration", "adversarial", "feature_matching", "discriminator"]
    header = ["step", "lr", *(f"loss/{name}" for name in losses), "loss/total",
              *(f"loss_weighted/{name}" for name in losses), "eval/cer", "eval/mcd"]
    rows = [[str(step), "0.0002", *(str(1.0 / step + index) for index in range(len(losses) + 1)),
             *(str(2.0 / step + index) for index in range(len(losses))),
             *([f"{1 / step:.3f}", f"{9 / step:.3f}"] if step % 10 == 0 else ["", ""])] for step in range(1, 31)]
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "metrics.csv").write_text("\n".join(",".join(row) for row in [header, *rows]) + "\n")
    (tmp_path / "logs" / "metrics.csv").open("a").write("31,0.0002,not-a-number" + "," * (len(header) - 3) + "\n")
    page = write_report(tmp_path).read_text(encoding="utf-8")
    raw, weighted, learning_rate = svg_texts(section(page, "curves"))
    assert all(f">{name}<" in raw and f">{name}<" in weighted for name in losses)
    evaluation = section(page, "evaluation")
    assert [svg.count(">cer<") + svg.count(">mcd<") for svg in svg_texts(evaluation)] == [1, 1]
    assert "<tr><td>20</td><td>0.05</td><td>0.45</td></tr>" in evaluation  # the metrics at each evaluated step
    assert "1 cell(s) of logs/metrics.csv are not numbers" in page  # said, not dropped silently
    assert "no summary.json yet" in page and "No samples yet" in page


def test_report_lists_excluded_items_by_kind_with_ids(short_run, page):
    data = section(page, "data")
    report = json.loads((short_run[0] / "data_report.json").read_text())
    assert f"<b>{report['items_usable']}</b> of {report['items_total']} items usable" in data
    for item_id, (error_kind, warning_kinds) in EXPECTED.items():
        for kind in ({error_kind} - {None}) | warning_kinds:
            row = re.search(rf"<tr><td>{kind}</td>(.*?)</tr>", data, re.S).group(1)
            assert item_id in row, (kind, item_id)
            assert ("excluded" in row) == (kind == error_kind)


def test_report_shows_skipped_batches_by_reason_with_their_items(short_run, page):
    skipped = section(page, "skipped-batches")
    record = json.loads((short_run[0] / "logs" / "skipped_batches.jsonl").read_text().splitlines()[0])
    assert "<td>nonfinite_loss</td><td>1</td><td>skipped</td>" in skipped
    assert all(item_id in skipped for item_id in record["ids"]) and "mel=nan" in skipped


def test_report_has_players_and_pictures_for_every_sample(short_run, page):
    run_dir = short_run[0]
    sources = set(re.findall(r'<audio controls preload="metadata" src="([^"]+)"', page))
    wavs = {wav.relative_to(run_dir).as_posix() for wav in (run_dir / "samples").rglob("*.wav")}
    assert sources == wavs and len(wavs) == 2 * 3  # steps 2 and 4: a text, a validation item and its recording
    pictures = set(re.findall(r'<img class="sample" src="([^"]+)"', page))
    assert pictures == {png.relative_to(run_dir).as_posix() for png in (run_dir / "samples").rglob("*.png")}
    assert page.index("Step 4") < page.index("Step 2")  # newest first
    assert "Hello there." in page  # the text a sample speaks, next to it
    assert "http://" not in page and "https://" not in page  # nothing from the network


def test_report_opens_in_headless_chromium(short_run, chromium, tmp_path):
    run_dir = short_run[0]
    screenshot = tmp_path / "report.png"
    check = chromium.check(run_dir / REPORT, screenshot)
    assert check.errors == []
    wavs = list((run_dir / "samples").rglob("*.wav"))
    assert len(check.audio) == len(wavs)
    for audio in check.audio:  # every player loaded its file and knows its length
        seconds = sf.info(run_dir / audio["src"]).duration
        assert audio["error"] is None and audio["readyState"] >= 1, audio
        assert audio["duration"] == pytest.approx(seconds, abs=0.05), audio
    assert check.images and all(image["complete"] and image["width"] > 0 for image in check.images), check.images
    assert screenshot.stat().st_size > 20_000
    ARTIFACTS.mkdir(exist_ok=True)
    shutil.copy(screenshot, ARTIFACTS / "report.png")


def test_the_browser_check_fails_on_a_page_whose_files_are_missing(short_run, chromium, tmp_path):
    shutil.copy(short_run[0] / REPORT, tmp_path / REPORT)  # the page without the run's samples beside it
    check = chromium.check(tmp_path / REPORT, tmp_path / "broken.png")
    assert check.audio and all(audio["error"] is not None for audio in check.audio)
    assert any(not image["width"] for image in check.images)
    assert any("ERR_FILE_NOT_FOUND" in error for error in check.errors), check.errors


def test_report_command_writes_the_page_and_refuses_a_folder_that_is_no_run(short_run, tmp_path, capsys):
    run_dir, _ = short_run
    assert main(["report", str(run_dir)]) == 0
    assert str(run_dir / REPORT) in capsys.readouterr().out
    assert main(["report", str(tmp_path)]) == 2
    assert "has no config.yaml" in capsys.readouterr().err


def test_a_page_that_cannot_be_written_is_logged_and_never_raises(tmp_path, caplog):
    (tmp_path / REPORT).mkdir()  # a folder where the page should go: the rename over it fails
    with caplog.at_level(logging.WARNING, logger="voicesmith.report"):
        assert refresh_report(tmp_path, training_step=7) is None
    assert f"The report page {tmp_path / REPORT} could not be refreshed" in caplog.text
