"""The `voicesmith` command line: parse, then call one function per command.

Nothing heavy is imported here: each command imports its module when it runs,
so `voicesmith --help` stays instant and never touches torch.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Callable, Optional

EXAMPLES = """\
a first voice, start to finish:
  voicesmith demo                                  # make a corpus, train a tiny model, write samples
  voicesmith validate my_corpus --report report.json
  voicesmith init my_corpus runs/my_voice --preset small
  voicesmith train runs/my_voice/config.yaml       # resumes automatically after any stop
  voicesmith synth runs/my_voice "Hello there." -o hello.wav

Exit codes: 0 success, 1 the run failed, 2 bad input (data, config or arguments).
Add --debug before the command to see a traceback on error."""


def _formatter(prog: str) -> argparse.HelpFormatter:
    return argparse.RawDescriptionHelpFormatter(prog, max_help_position=34)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="voicesmith", formatter_class=_formatter,
        description="Train your own text-to-speech voice from your own recordings, and ship it.",
        epilog=EXAMPLES)
    parser.add_argument("--debug", action="store_true", help="show the full traceback on errors")
    parser.add_argument("--version", action="version", version=f"voicesmith {_version()}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    for add in (_add_doctor, _add_demo_corpus, _add_validate, _add_init, _add_prepare, _add_train,
                _add_synth, _add_export, _add_export_weights, _add_eval, _add_import_voice, _add_report, _add_demo):
        add(commands)
    return parser


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("voicesmith")
    except PackageNotFoundError:
        return "unknown"


def _command(commands, name: str, help: str, example: str, handler: Callable) -> argparse.ArgumentParser:
    sub = commands.add_parser(name, help=help, description=help, formatter_class=_formatter,
                              epilog=f"example:\n  {example}")
    sub.set_defaults(handler=handler)
    return sub


def _add_overrides(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                     help="override a config key, e.g. --set train.batch_size=8 (repeatable)")
    switches = sub.add_argument_group("model switches (each also settable with --set model.KEY=...)")
    switches.add_argument("--gst", action=argparse.BooleanOptionalAction, default=None,
                          help="global style tokens")
    switches.add_argument("--freeze-speaker-encoder", action=argparse.BooleanOptionalAction, default=None,
                          help="keep an external speaker encoder frozen")


def _switch_overrides(args: argparse.Namespace) -> list[str]:
    """Paired flags become ordinary overrides, so there is one way config changes."""
    overrides = list(getattr(args, "overrides", []) or [])
    for flag, key in (("gst", "model.gst"), ("freeze_speaker_encoder", "model.freeze_speaker_encoder")):
        value = getattr(args, flag, None)
        if value is not None:
            overrides.append(f"{key}={str(value).lower()}")
    return overrides


# --- commands ---------------------------------------------------------------

def _add_doctor(commands) -> None:
    sub = _command(commands, "doctor", "check that this machine can train (exit 0 when it can)",
                   "voicesmith doctor --config runs/my_voice/config.yaml", _run_doctor)
    sub.add_argument("--json", action="store_true", help="print the checks as JSON")
    sub.add_argument("--config", type=Path, help="also check the dataset and every path of this config")


def _run_doctor(args) -> int:
    from voicesmith.doctor import doctor_command

    return doctor_command(config_path=args.config, as_json=args.json)


def _add_demo_corpus(commands) -> None:
    sub = _command(commands, "demo-corpus", "write an LJSpeech-format corpus spoken by the bundled espeak-ng",
                   "voicesmith demo-corpus demo_data --n 100", _run_demo_corpus)
    sub.add_argument("out", type=Path, metavar="OUT", help="folder to write (metadata.csv + wavs/)")
    sub.add_argument("--n", type=int, default=100, help="number of utterances (default 100)")
    sub.add_argument("--speakers", type=int, default=1,
                     help="several speakers write a VCTK-layout corpus (default 1)")


def _run_demo_corpus(args) -> int:
    from voicesmith.demo_corpus import write_demo_corpus

    out = write_demo_corpus(args.out, n=args.n, speakers=args.speakers)
    print(f"Wrote {args.n} utterances to {out}")
    return 0


def _add_validate(commands) -> None:
    sub = _command(commands, "validate", "check a corpus item by item; exit 0 when at least one item is usable",
                   "voicesmith validate my_corpus --report report.json", _run_validate)
    sub.add_argument("dataset", type=Path, metavar="DATASET",
                     help="LJSpeech or VCTK folder, or a filelist (path|text or path|speaker|text)")
    sub.add_argument("--report", type=Path, metavar="FILE.json", help="write the report as JSON")
    sub.add_argument("--format", default="auto", choices=["auto", "ljspeech", "vctk", "filelist"])
    sub.add_argument("--config", type=Path, help="take limits (durations, audio settings) from this config")
    sub.add_argument("--asr", action="store_true",
                     help="also transcribe each item with the offline recogniser (English) and flag transcripts "
                          "it does not hear (warned; data.asr_check: exclude excludes them)")
    sub.add_argument("--with-model", type=Path, metavar="RUN_DIR",
                     help="rank the items by a trained run's per-item loss and alignment, worst first")


def _run_validate(args) -> int:
    from voicesmith.data.validate import validate_command

    checks = []
    if args.with_model is not None:
        from voicesmith.inference import find_model_file
        from voicesmith.model_check import CHECK, model_check

        find_model_file(args.with_model)  # a wrong RUN_DIR is refused before the corpus is checked
        checks.append((CHECK, lambda report: model_check(report, args.with_model, progress=sys.stderr.isatty())))
    return validate_command(args.dataset, args.report, args.format, config_path=args.config, asr=args.asr,
                            extra_checks=checks)


def _add_init(commands) -> None:
    sub = _command(commands, "init", "write RUN_DIR/config.yaml for a dataset (paths relative to that file)",
                   "voicesmith init my_corpus runs/my_voice --model acoustic --preset tiny", _run_init)
    sub.add_argument("dataset", type=Path, metavar="DATASET")
    sub.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    sub.add_argument("--model", default="acoustic", choices=["acoustic", "vits", "vocoder"])
    sub.add_argument("--preset", default=None,
                     help="acoustic: tiny|small|medium|high; vits (Piper's quality levels): tiny|x-low|low|medium|high; "
                          "vocoder: tiny|hifigan-v1|hifigan-v2|hifigan-v3|vocos. tiny trains on 2 CPU cores in "
                          "minutes; high wants a GPU")
    sub.add_argument("--force", action="store_true", help="overwrite an existing config.yaml")
    _add_overrides(sub)


def _run_init(args) -> int:
    from voicesmith.config import init_run, preset_choice

    preset = args.preset
    if preset is None:
        preset, why = preset_choice(args.model)
        print(f"Preset {preset}: {why}.")
    path = init_run(args.dataset, args.run_dir, args.model, preset, _switch_overrides(args), args.force)
    print(f"Wrote {path}\nNext: voicesmith train {path}")
    return 0


def _add_prepare(commands) -> None:
    sub = _command(commands, "prepare", "build the feature cache (train does it too when missing)",
                   "voicesmith prepare runs/my_voice/config.yaml", _run_prepare)
    sub.add_argument("config", type=Path, metavar="CONFIG")
    _add_overrides(sub)


def _run_prepare(args) -> int:
    from voicesmith.data.cache import prepare_command

    return prepare_command(args.config, _switch_overrides(args))


def _add_train(commands) -> None:
    sub = _command(commands, "train", "train a voice; resumes from the last checkpoint by default",
                   "voicesmith train runs/my_voice/config.yaml --max-steps 2000 --set train.batch_size=8",
                   _run_train)
    sub.add_argument("config", type=Path, metavar="CONFIG")
    sub.add_argument("--resume", default="auto", metavar="auto|never|PATH",
                     help="auto: continue from checkpoints/last.ckpt when present (default)")
    sub.add_argument("--max-steps", type=int, help="stop at this optimizer step, counted from the start of the run")
    sub.add_argument("--max-epochs", type=int, help="stop after this many epochs, counted from the start")
    sub.add_argument("--max-samples", type=int, help="train on at most this many items (quick runs)")
    sub.add_argument("--stage", default=None, choices=["acoustic", "vocoder", "both"],
                     help="for an acoustic run: both = acoustic model, then a vocoder fine-tuned on its mels "
                          "(RUN_DIR/vocoder/); vocoder = that second stage alone. Default: the config's own model, "
                          "and both when train.stage2.max_steps is set")
    _add_overrides(sub)


def _run_train(args) -> int:
    from voicesmith.training import train_command

    return train_command(args.config, resume=args.resume, max_steps=args.max_steps, max_epochs=args.max_epochs,
                         max_samples=args.max_samples, stage=args.stage, overrides=_switch_overrides(args))


def _add_synth(commands) -> None:
    sub = _command(commands, "synth", "speak text with a trained voice",
                   'voicesmith synth runs/my_voice "Hello there." -o hello.wav', _run_synth)
    sub.add_argument("model", type=Path, metavar="MODEL", help="checkpoint, run dir or .onnx")
    sub.add_argument("text", metavar="TEXT", help='text to speak; "-" reads standard input')
    sub.add_argument("-o", "--output", type=Path, required=True, metavar="OUT.wav")
    sub.add_argument("--speaker", help="speaker name, for multi-speaker voices")
    sub.add_argument("--length-scale", type=float, help="above 1 speaks slower (default: the voice's own, 1)")
    sub.add_argument("--noise-scale", type=float, help="sampling noise (VITS voices)")
    sub.add_argument("--noise-w", type=float, help="duration noise (VITS voices)")
    sub.add_argument("--vocoder", metavar="griffin-lim|PATH",
                     help="acoustic voices: the run's own vocoder when it has one (default), griffin-lim, or a "
                          "vocoder checkpoint/run with the same audio settings")


def _run_synth(args) -> int:
    from voicesmith.errors import UserInputError
    from voicesmith.onnx_voice import is_onnx_voice

    if is_onnx_voice(args.model):  # onnxruntime only: torch is never imported
        from voicesmith.onnx_voice import synth_command
    else:
        from voicesmith.inference import synth_command
    text = sys.stdin.read() if args.text == "-" else args.text
    if not text.strip():
        raise UserInputError("No text to speak: TEXT is empty" + (" (standard input was empty)." if args.text == "-" else "."))
    if args.vocoder is not None and is_onnx_voice(args.model):
        raise UserInputError(f"--vocoder applies to acoustic voices; {args.model} is an ONNX voice that makes its "
                             f"own audio. Leave out --vocoder.")
    vocoder = {} if args.vocoder is None else {"vocoder": args.vocoder}
    return synth_command(args.model, text, args.output, speaker=args.speaker, noise_scale=args.noise_scale,
                         length_scale=args.length_scale, noise_w=args.noise_w, **vocoder)


def _add_export(commands) -> None:
    sub = _command(commands, "export", "export a voice in Piper's format: VOICE.onnx + VOICE.onnx.json (a VITS "
                   "voice, or an acoustic voice together with its trained vocoder)",
                   "voicesmith export runs/my_voice -o my_voice.onnx", _run_export)
    sub.add_argument("checkpoint", type=Path, metavar="CHECKPOINT|RUN_DIR")
    sub.add_argument("-o", "--output", type=Path, required=True, metavar="VOICE.onnx")
    sub.add_argument("--vocoder", metavar="PATH", help="acoustic voices: the vocoder checkpoint or run to export "
                                                        "with it (default: the run's own, RUN_DIR/vocoder/)")


def _run_export(args) -> int:
    from voicesmith.export import export_command

    return export_command(args.checkpoint, args.output, args.vocoder)


def _add_export_weights(commands) -> None:
    sub = _command(commands, "export-weights", "write a checkpoint's weights as safetensors + voice.json",
                   "voicesmith export-weights runs/my_voice/checkpoints/best.ckpt my_voice_weights",
                   _run_export_weights)
    sub.add_argument("checkpoint", type=Path, metavar="CHECKPOINT")
    sub.add_argument("out_dir", type=Path, metavar="OUT_DIR")


def _run_export_weights(args) -> int:
    from voicesmith.checkpoint import export_weights, load_checkpoint

    out = export_weights(load_checkpoint(args.checkpoint), args.out_dir)
    print(f"Wrote {out / 'model.safetensors'} and {out / 'voice.json'}")
    return 0


def _add_eval(commands) -> None:
    sub = _command(commands, "eval", "score a voice: intelligibility (CER/WER), distortion (MCD), speed (RTF)",
                   "voicesmith eval runs/my_voice --limit 20 --json eval.json", _run_eval)
    sub.add_argument("model", type=Path, metavar="MODEL", help="checkpoint, run dir or .onnx voice")
    sub.add_argument("dataset", type=Path, nargs="?", metavar="DATASET",
                     help="items to score (default: the run's validation split; required for .onnx voices)")
    sub.add_argument("--limit", type=int, help="score at most N items")
    sub.add_argument("--json", type=Path, metavar="FILE", help="write the results as JSON")


def _run_eval(args) -> int:
    from voicesmith.evaluate import eval_command

    return eval_command(args.model, args.dataset, args.limit, args.json)


def _add_import_voice(commands) -> None:
    sub = _command(commands, "import-voice", "turn a published VITS voice (Piper .ckpt or .onnx with its .onnx.json, "
                   "transformers VitsModel folder) into a voicesmith run to fine-tune",
                   "voicesmith import-voice en_US-joe-medium.onnx runs/joe_ft --dataset my_corpus", _run_import_voice)
    sub.add_argument("source", type=Path, metavar="SOURCE")
    sub.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    sub.add_argument("--dataset", type=Path, default=None, metavar="DATASET",
                     help="the corpus to fine-tune on (written to config.yaml; its new symbols join the table)")


def _run_import_voice(args) -> int:
    from voicesmith.importers import import_voice

    result = import_voice(args.source, args.run_dir, args.dataset)
    print(result.report.describe())
    print(f"Wrote {result.config_path}, {result.checkpoint} and the report {args.run_dir / 'import_report.json'}\n"
          f"Next: {result.next_command}")
    return 0


def _add_report(commands) -> None:
    sub = _command(commands, "report", "write RUN_DIR/report.html: curves, samples to listen to, data, config",
                   "voicesmith report runs/my_voice", _run_report)
    sub.add_argument("run_dir", type=Path, metavar="RUN_DIR")


def _run_report(args) -> int:
    from voicesmith.report import report_command

    return report_command(args.run_dir)


def _add_demo(commands) -> None:
    sub = _command(commands, "demo", "make a demo corpus, train a tiny voice on it and write samples",
                   "voicesmith demo --out voicesmith-demo", _run_demo)
    sub.add_argument("--out", type=Path, default=Path("voicesmith-demo"), help="folder for corpus and run")
    sub.add_argument("--n", type=int, default=120, help="utterances in the demo corpus (default 120)")
    sub.add_argument("--minutes", type=float, default=6.0, help="training time budget (default 6)")
    sub.add_argument("--max-steps", type=int, help="stop training at this step instead of the time budget")


def _run_demo(args) -> int:
    from voicesmith.demo import run_demo

    return run_demo(args.out, n=args.n, minutes=args.minutes, max_steps=args.max_steps)


# --- entry point --------------------------------------------------------------

def main(argv: Optional[list[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    try:
        return int(args.handler(args) or 0)
    except KeyboardInterrupt:
        print("voicesmith: interrupted.", file=sys.stderr)
        return 1
    except Exception as exc:  # the one place that turns every error into a message and an exit code
        return _report(exc, args.debug)


def _report(exc: Exception, debug: bool) -> int:
    from voicesmith.errors import VoicesmithError

    if debug:
        import traceback

        traceback.print_exc()
    if isinstance(exc, VoicesmithError):
        print(f"voicesmith: {exc}", file=sys.stderr)
        return exc.exit_code
    print(f"voicesmith: internal error: {type(exc).__name__}: {exc}\n"
          f"This is a bug in voicesmith, not in your data. Run again with --debug for the traceback "
          f"and report it.", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
