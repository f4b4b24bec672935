"""A speaker added to the corpus before a resume is a clear error that names the speaker and the way on,
never a raw state_dict error reported as a bug in voicesmith."""

from __future__ import annotations

import shutil

import pytest

from voicesmith.errors import ConfigError
from voicesmith.training import train


def test_a_speaker_added_before_resume_is_a_clear_error(make_run, multispeaker_corpus, tmp_path):
    corpus = tmp_path / "corpus"
    shutil.copytree(multispeaker_corpus, corpus)
    newcomer = sorted(path.name for path in (corpus / "wav").iterdir())[-1]
    parked = tmp_path / "parked"
    for part in ("wav", "txt"):
        (parked / part).mkdir(parents=True)
        shutil.move(corpus / part / newcomer, parked / part / newcomer)
    config = make_run(f"data.dataset={corpus}", "data.max_samples=null", own_cache=True)
    assert train(config, max_steps=1)["status"] == "completed"

    for part in ("wav", "txt"):
        shutil.move(parked / part / newcomer, corpus / part / newcomer)
    with pytest.raises(ConfigError, match=rf"speakers the checkpoint was not trained with \({newcomer}\).*"
                                          rf"--resume never --set train.init_from="):
        train(config, max_steps=2)
