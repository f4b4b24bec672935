"""`voicesmith init` without --preset: a preset that trains in reasonable time on this machine, and why."""

from __future__ import annotations

import torch
import yaml

from voicesmith.cli import main
from voicesmith.config import default_preset, preset_choice


def test_a_machine_without_cuda_gets_tiny_and_a_cuda_gpu_the_standard_preset():
    assert preset_choice("acoustic", cuda=False)[0] == "tiny"
    assert preset_choice("vits", cuda=False)[0] == "tiny"
    assert preset_choice("acoustic", cuda=True)[0] == "small"
    assert preset_choice("vits", cuda=True)[0] == "medium"
    assert "no CUDA GPU" in preset_choice("acoustic", cuda=False)[1]
    assert default_preset("acoustic") == preset_choice("acoustic", cuda=torch.cuda.is_available())[0]


def test_init_without_a_preset_says_which_it_took_and_why(demo_corpus, tmp_path, capsys):
    assert main(["init", str(demo_corpus), str(tmp_path / "run")]) == 0
    expected, why = preset_choice("acoustic", cuda=torch.cuda.is_available())
    assert f"Preset {expected}: {why}." in capsys.readouterr().out
    assert yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())["preset"] == expected


def test_an_explicit_preset_is_kept_without_a_word_about_the_machine(demo_corpus, tmp_path, capsys):
    assert main(["init", str(demo_corpus), str(tmp_path / "run"), "--preset", "small"]) == 0
    assert "Preset" not in capsys.readouterr().out
    assert yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())["preset"] == "small"
