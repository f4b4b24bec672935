"""Shared fixtures: the project makes its own test data with the bundled espeak-ng."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def demo_corpus(tmp_path_factory) -> Path:
    """A 24-utterance single-speaker LJSpeech corpus (22050 Hz mono PCM16). Treat as read-only."""
    from voicesmith.demo_corpus import write_demo_corpus

    return write_demo_corpus(tmp_path_factory.mktemp("demo_corpus"), n=24)


@pytest.fixture(scope="session")
def multispeaker_corpus(tmp_path_factory) -> Path:
    """A 24-utterance, 3-speaker VCTK-layout corpus (txt/<spk>, wav/<spk>). Treat as read-only."""
    from voicesmith.demo_corpus import write_demo_corpus

    return write_demo_corpus(tmp_path_factory.mktemp("multispeaker_corpus"), n=24, speakers=3)
