"""The command line: light --help, helpful subcommand help, exit codes, errors without tracebacks."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from voicesmith.cli import build_parser, main

COMMANDS = ["doctor", "demo-corpus", "validate", "init", "prepare", "train", "synth", "export",
            "export-weights", "eval", "import-voice", "demo"]


def run_cli(*args: str, cwd: Path | None = None, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "voicesmith.cli", *args], capture_output=True, text=True,
                          cwd=cwd, input=stdin, timeout=300)


def test_help_imports_no_heavy_module():
    code = ("import sys, voicesmith.cli as c\n"
            "try:\n    c.main(['--help'])\nexcept SystemExit:\n    pass\n"
            "print(sorted(m for m in ('torch', 'numpy', 'lightning', 'onnxruntime') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "[]"


def test_every_design_command_exists_with_an_example(capsys):
    parser = build_parser()
    for command in COMMANDS:
        with pytest.raises(SystemExit) as exit_info:
            parser.parse_args([command, "--help"])
        assert exit_info.value.code == 0
        out = capsys.readouterr().out
        assert "example:" in out and f"voicesmith {command}" in out, command


def test_import_voice_of_a_missing_source_exits_2(tmp_path: Path, capsys):
    assert main(["import-voice", str(tmp_path / "voice.onnx"), str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert "voice.onnx does not exist" in err and "Traceback" not in err


def test_bad_input_exits_2_with_one_paragraph(tmp_path: Path):
    result = run_cli("train", str(tmp_path / "missing.yaml"))
    assert result.returncode == 2
    assert "missing.yaml does not exist" in result.stderr and "Traceback" not in result.stderr
    result = run_cli("init", str(tmp_path / "no_corpus"), str(tmp_path / "run"))
    assert result.returncode == 2 and "no_corpus does not exist" in result.stderr


def test_debug_shows_the_traceback(tmp_path: Path):
    result = run_cli("--debug", "train", str(tmp_path / "missing.yaml"))
    assert result.returncode == 2 and "Traceback" in result.stderr


def test_init_with_paired_flags_and_overrides(tmp_path: Path):
    (tmp_path / "corpus").mkdir()
    assert main(["init", str(tmp_path / "corpus"), str(tmp_path / "run"), "--preset", "tiny", "--gst",
                 "--no-freeze-speaker-encoder", "--set", "train.batch_size=4"]) == 0
    from voicesmith.config import load_config

    config = load_config(tmp_path / "run" / "config.yaml")
    assert config.model.gst is True and config.model.freeze_speaker_encoder is False
    assert config.train.batch_size == 4
    assert main(["init", str(tmp_path / "corpus"), str(tmp_path / "run")]) == 2  # exists: needs --force


def test_doctor_json_schema():
    result = run_cli("doctor", "--json")
    report = json.loads(result.stdout)
    assert set(report) == {"can_train", "checks"}
    assert result.returncode == (0 if report["can_train"] else 1)
    names = {check["name"] for check in report["checks"]}
    assert {"python", "torch", "cpu", "espeak-ng", "disk", "memory", "dataloader workers", "run folder"} <= names
    for check in report["checks"]:
        assert set(check) == {"name", "status", "detail", "fix"} and check["status"] in ("ok", "warn", "fail")
        if check["status"] == "fail":
            assert check["fix"]


def test_doctor_checks_the_paths_of_a_config(tmp_path: Path):
    (tmp_path / "corpus").mkdir()
    main(["init", str(tmp_path / "corpus"), str(tmp_path / "run"), "--set", "train.init_from=base.ckpt"])
    from voicesmith.doctor import check_config

    checks = {check.name: check for check in check_config(tmp_path / "run" / "config.yaml")}
    assert checks["data.dataset"].status == "ok"
    assert checks["data.dataset"].detail.endswith("(outside the run directory)")  # ../corpus leaves the run folder
    assert checks["train.init_from"].status == "fail" and "base.ckpt does not exist" in checks["train.init_from"].detail
