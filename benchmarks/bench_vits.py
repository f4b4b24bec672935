"""VITS training speed and memory on the CPU, side by side with coqui-tts and Piper (issue 17).

1. Peers: `../shared/bench/peer_vits/` trains coqui-tts 0.28.0 and piper-tts 1.8.0 for 26 steps at one
   fixed small configuration on the same 256-utterance subset of a corpus (its README gives all of it).
   This script runs both peer scripts and then voicesmith at exactly that configuration, one after the
   other in one invocation (`--rounds` times), and compares them only within a round.
2. Presets: steps/s and peak memory of voicesmith's own VITS presets (e.g. tiny and medium) on the
   same subset, with the preset's batch size or a smaller one (`--presets tiny:8,medium:8`).

Measurement (the peers' definition): sec/step is the median wall-clock interval between consecutive
training-step ends for steps 5..25 (a step: one discriminator + one generator update), taken by a
Lightning callback; it includes data loading, both updates and the engine's logging. Peak RSS is
`ru_maxrss` of the training process, a subprocess of this script, so it is that process's own. The
feature cache is built fresh in that process before the first step (as Piper preprocesses in its own
process), so it counts in the peak RSS but not in sec/step. Spawned cache workers, if any, are
reported separately (`RUSAGE_CHILDREN`).

    python benchmarks/bench_vits.py --corpus /tmp/peerbench/corpus --work /tmp/peerbench --rounds 2 \
        --python /tmp/vsvenv/bin/python --out benchmarks/RESULTS_vits.md   # a runtime-only venv, as the peers
    python benchmarks/bench_vits.py --corpus /tmp/peerbench/corpus --work /tmp/peerbench --rounds 0 \
        --presets tiny:8:26,medium:8:10 --out benchmarks/RESULTS_vits.md
    python benchmarks/bench_vits.py --corpus /tmp/peerbench/corpus --work /tmp/peerbench --profile 4

Results of every invocation accumulate in WORK/bench_vits.json; `--out` renders all of them.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import resource
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Optional

HERE = Path(__file__).resolve().parent
DEFAULT_PEER_DIR = HERE.parent.parent / "shared" / "bench" / "peer_vits"
PEER_SCRIPTS = {"coqui-vits": "run_coqui.sh", "piper-vits": "run_piper.sh"}
PEER_LINE = re.compile(r"^PEER (?P<name>\S+) sec_per_step=(?P<sec>[\d.]+) params_g=(?P<g>\d+) params_d=(?P<d>\d+) "
                       r"batch=(?P<batch>\d+) peak_rss_mb=(?P<rss>\d+)", re.MULTILINE)
SUBSET_ITEMS = 256
FIRST_TIMED_STEP = 5  # 1-based, as the peers: steps 5..N-1 of N
TARGET_SPEED, TARGET_RSS = 1.3, 0.8

# The peers' fixed configuration (peer_vits/README.md) in voicesmith's keys, over the vits tiny preset.
PEER_CONFIG = [
    "model.hidden_channels=96", "model.inter_channels=96", "model.encoder_ffn_channels=384",
    "model.encoder_heads=2", "model.encoder_layers=6", "model.encoder_kernel_size=3", "model.dropout=0.1",
    "model.posterior_layers=16", "model.posterior_kernel_size=5",
    "model.flow_layers=4", "model.flow_wavenet_layers=4", "model.flow_kernel_size=5",
    "model.stochastic_duration=true", "model.duration_predictor_channels=96",
    "model.resblock='2'", "model.resblock_kernel_sizes=[3, 5, 7]",
    "model.resblock_dilation_sizes=[[1, 2], [2, 6], [3, 12]]", "model.upsample_rates=[8, 8, 4]",
    "model.upsample_kernel_sizes=[16, 16, 8]", "model.upsample_initial_channel=128",
    "model.discriminator_periods=[2, 3, 5, 7, 11]", "model.multi_resolution_discriminator=false",
    "model.segment_frames=32",
    "audio.sample_rate=22050", "audio.n_fft=1024", "audio.win_length=1024", "audio.hop_length=256",
    "audio.n_mels=80", "audio.f_min=0.0", "audio.f_max=null",
    "train.learning_rate=2e-4", "train.betas=[0.8, 0.99]", "data.val_fraction=0.05",
]
# What every measured run sets: the CPU in fp32, no workers (all work in the measured process), no
# silence trimming (the peers' data), and nothing but training (no validation, samples or checkpoints
# before the last step).
MEASURED_RUN = ["hardware.accelerator=cpu", "hardware.precision='32'", "data.num_workers=0",
                "data.trim_silence=false", "samples.every_n_steps=0", "samples.on_best=false",
                "eval.every_n_steps=0", "train.val_every_n_steps=1000000",
                "train.checkpoint_every_n_steps=1000000", "logging.progress_bar=false"]


# --- the measured process ----------------------------------------------------------------------------

def peak_rss_mb(who: int = resource.RUSAGE_SELF) -> float:
    return resource.getrusage(who).ru_maxrss / 1024  # Linux: KiB


def make_step_timer(steps: int):
    """A Lightning callback that timestamps step ends and notes the peak RSS at milestones."""
    from lightning.pytorch.callbacks import Callback

    class StepTimer(Callback):
        def __init__(self):
            self.marks: list[float] = []
            self.compute: list[float] = []
            self.rss: dict[str, float] = {}
            self.params: dict[str, int] = {}
            self.started = 0.0

        def on_train_start(self, trainer, pl_module) -> None:
            self.params = pl_module.model.parameter_counts()
            self.rss["train start (cache + model)"] = peak_rss_mb()

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
            self.started = time.perf_counter()

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            now = time.perf_counter()
            self.compute.append(now - self.started)
            self.marks.append(now)
            if len(self.marks) == 1:
                self.rss["after step 1"] = peak_rss_mb()
            if len(self.marks) == steps:
                self.rss[f"after step {steps}"] = peak_rss_mb()

    return StepTimer()


def timed_median(values: list[float], steps: int) -> float:
    """Median over steps FIRST_TIMED_STEP..steps-1 (1-based) of per-step values indexed from step 2."""
    return statistics.median(values[FIRST_TIMED_STEP - 2:steps - 2])


def build_config(dataset: Path, run_dir: Path, preset: str, batch: int, extra: list[str]):
    from voicesmith.config import apply_override, preset_dict, validate_config

    raw = preset_dict(preset, str(dataset), "vits")
    for item in [*extra, *MEASURED_RUN, f"train.batch_size={batch}", f"data.cache_dir={run_dir / 'cache'}"]:
        apply_override(raw, item)
    config = validate_config(raw, source="bench_vits")
    config.save(run_dir / "config.yaml")
    return config


def child(args: argparse.Namespace) -> None:
    """Train in this process and print one PEER line (the peers' format) and a detail line."""
    rss_start = peak_rss_mb()
    import torch

    from voicesmith.training import train

    extra = PEER_CONFIG if args.peer_config else []
    run_dir = Path(args.run_dir)
    shutil.rmtree(run_dir, ignore_errors=True)
    config = build_config(Path(args.dataset), run_dir, args.preset, args.batch, extra)
    timer = make_step_timer(args.steps)
    summary = train(config, resume="never", max_steps=args.steps, callbacks=[timer])
    if len(timer.marks) < args.steps:
        sys.exit(f"voicesmith: only {len(timer.marks)} steps ran ({summary.get('status')}: {summary.get('reason')})")
    wall = [b - a for a, b in zip(timer.marks, timer.marks[1:])]  # wall[i]: duration of step i + 2 (1-based)
    rss = timer.rss[f"after step {args.steps}"]
    detail = {"compute_sec_per_step": timed_median(timer.compute[1:], args.steps), "threads": torch.get_num_threads(),
              "torch": torch.__version__, "rss_before_imports_mb": round(rss_start),
              "rss_milestones_mb": {k: round(v) for k, v in timer.rss.items()},
              "rss_at_exit_mb": round(peak_rss_mb()), "rss_children_mb": round(peak_rss_mb(resource.RUSAGE_CHILDREN)),
              "skipped": summary.get("batches_skipped"), "last_losses": summary.get("last_losses"),
              "transformers_imported": "transformers" in sys.modules}
    print("voicesmith: " + json.dumps(detail), flush=True)
    print(f"PEER {args.name} sec_per_step={timed_median(wall, args.steps):.3f} "
          f"params_g={timer.params['generator']} params_d={timer.params['discriminator']} batch={args.batch} "
          f"peak_rss_mb={rss:.0f}", flush=True)


# --- the orchestrator ----------------------------------------------------------------------------------

class LoadSampler:
    """The 1-minute load average every few seconds while a measurement runs (its own process adds ~2)."""

    def __init__(self, every: float = 10.0):
        self.every, self.values = every, [os.getloadavg()[0]]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self.values.append(os.getloadavg()[0])

    def __enter__(self) -> "LoadSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.values.append(os.getloadavg()[0])

    def summary(self) -> dict[str, float]:
        return {"load_start": self.values[0], "load_mean": statistics.fmean(self.values), "load_max": max(self.values)}


def measurement_env() -> dict[str, str]:
    """The peers' thread setting (OMP threads = nproc), for every process measured."""
    return {**os.environ, "OMP_NUM_THREADS": str(os.cpu_count() or 1)}


def run_measured(command: list[str], env: dict[str, str], log_path: Path) -> dict[str, Any]:
    """Run one measured process; its PEER line, its detail line and the load while it ran."""
    started = time.time()
    with LoadSampler() as load:
        done = subprocess.run(command, env=env, capture_output=True, text=True)
    log_path.write_text(done.stdout + done.stderr, encoding="utf-8")
    match = PEER_LINE.search(done.stdout)
    if done.returncode or not match:
        raise SystemExit(f"{' '.join(command)} failed (exit {done.returncode}); see {log_path}:\n"
                         f"{(done.stdout + done.stderr)[-3000:]}")
    details = [line.split(":", 1)[1].strip() for line in done.stdout.splitlines()
               if re.match(r"^(coqui|piper|voicesmith): ", line)]
    return {"name": match["name"], "sec_per_step": float(match["sec"]), "params_g": int(match["g"]),
            "params_d": int(match["d"]), "batch": int(match["batch"]), "peak_rss_mb": int(match["rss"]),
            "detail": details, "seconds_total": round(time.time() - started), **load.summary()}


def make_dataset(corpus: Path, work: Path, peer_dir: Path) -> Path:
    """The peers' subset (their make_subset.py) as an LJSpeech folder: its metadata.csv + the corpus's wavs."""
    subprocess.run([sys.executable, str(peer_dir / "make_subset.py"), str(corpus), str(work / "data"),
                    str(SUBSET_ITEMS)], check=True)
    dataset = work / "voicesmith_data"
    dataset.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(work / "data" / "metadata.csv", dataset / "metadata.csv")
    wavs = dataset / "wavs"
    if not wavs.is_symlink():
        wavs.symlink_to((corpus / "wavs").resolve(), target_is_directory=True)
    return dataset


def child_command(args: argparse.Namespace, dataset: Path, name: str, preset: str, batch: int, steps: int,
                  peer_config: bool) -> list[str]:
    command = [str(args.python), str(Path(__file__).resolve()), "--child", "--dataset", str(dataset),
               "--run-dir", str(args.work / f"run_{name}"), "--name", name, "--preset", preset,
               "--batch", str(batch), "--steps", str(steps)]
    return command + (["--peer-config"] if peer_config else [])


def compare_round(args: argparse.Namespace, dataset: Path) -> list[dict[str, Any]]:
    """coqui, piper, voicesmith, one after the other."""
    results = []
    env = {**measurement_env(), "PEER_WORK": str(args.work), "PEER_CORPUS": str(args.corpus),
           "PEER_BATCH": str(args.batch)}
    for name, script in PEER_SCRIPTS.items():
        print(f"[bench_vits] {name} ...", flush=True)
        results.append(run_measured(["bash", str(args.peer_dir / script), str(args.steps)], env,
                                    args.work / f"{name}.log"))
        print(f"[bench_vits] {results[-1]}", flush=True)
    print("[bench_vits] voicesmith ...", flush=True)
    command = child_command(args, dataset, "voicesmith-vits", "tiny", args.batch, args.steps, peer_config=True)
    results.append(run_measured(command, measurement_env(), args.work / "voicesmith-vits.log"))
    print(f"[bench_vits] {results[-1]}", flush=True)
    return results


def run_presets(args: argparse.Namespace, dataset: Path) -> list[dict[str, Any]]:
    results = []
    for spec in args.presets.split(","):
        preset, batch, steps = spec.split(":")
        name = f"voicesmith-vits-{preset}"
        print(f"[bench_vits] {name} batch {batch}, {steps} steps ...", flush=True)
        command = child_command(args, dataset, name, preset, int(batch), int(steps), peer_config=False)
        result = run_measured(command, measurement_env(), args.work / f"{name}.log")
        results.append({**result, "preset": preset, "steps": int(steps)})
        print(f"[bench_vits] {results[-1]}", flush=True)
    return results


# --- profile ------------------------------------------------------------------------------------------------

def current_rss_mb() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


class PhaseMemory:
    """Resident and peak memory after each phase of a training step: the generator pass, the two
    discriminator loss passes, each backward and each optimizer update (wrapped on the live objects)."""

    def __init__(self):
        self.rows: list[tuple[str, float, float]] = []
        self.active = False

    def note(self, phase: str) -> None:
        if self.active:
            self.rows.append((phase, current_rss_mb(), peak_rss_mb()))

    def wrap(self, owner: Any, attribute: str, phase: str) -> None:
        original = getattr(owner, attribute)

        def wrapped(*args, **kwargs):
            result = original(*args, **kwargs)
            self.note(phase)
            return result

        setattr(owner, attribute, wrapped)

    def attach(self, model: Any, optimizers: list[Any]) -> None:
        import torch

        self.wrap(model, "forward", "generator forward (posterior, flow, MAS, decoder)")
        self.wrap(model, "discriminator_losses", "discriminator pass, real + fake")
        self.wrap(model, "generator_losses", "discriminator pass for the generator loss")
        self.wrap(torch.autograd, "backward", "backward")
        for name, optimizer in zip(("generator", "discriminator"), optimizers):
            self.wrap(optimizer.optimizer, "step", f"{name} update")


def profile(args: argparse.Namespace, dataset: Path) -> None:
    """torch.profiler over `--profile` steps of the peer configuration after 2 warm-up steps: the top 15
    ops by self CPU time and by memory they allocate, and the RSS after each phase of a step."""
    import torch
    from lightning.pytorch.callbacks import Callback

    from voicesmith.training import train

    warmup, steps = 2, args.profile
    phases = PhaseMemory()

    class Profiled(Callback):
        def __init__(self):
            self.profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                                   profile_memory=True)

        def on_train_start(self, trainer, pl_module) -> None:
            phases.attach(pl_module.model, pl_module.optimizers())

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
            phases.active = trainer.global_step in (0, warmup)
            phases.note(f"step {trainer.global_step + 1} start")
            if trainer.global_step == warmup:
                self.profiler.__enter__()

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            if trainer.global_step == warmup + steps:
                self.profiler.__exit__(None, None, None)

    run_dir = args.work / "run_profile"
    shutil.rmtree(run_dir, ignore_errors=True)
    config = build_config(dataset, run_dir, "tiny", args.batch, PEER_CONFIG)
    callback = Profiled()
    train(config, resume="never", max_steps=warmup + steps, callbacks=[callback])
    averages = callback.profiler.key_averages()
    print(f"Profile of {steps} steps (peer configuration, batch {args.batch}, {torch.get_num_threads()} threads):")
    print(averages.table(sort_by="self_cpu_time_total", row_limit=15))
    print(averages.table(sort_by="self_cpu_memory_usage", row_limit=15))
    print("RSS after each phase (MB): phase | resident now | peak so far")
    for phase, now, peak in phases.rows:
        print(f"  {phase:55s} {now:8.0f} {peak:8.0f}")


# --- results ----------------------------------------------------------------------------------------------

def load_results(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {"rounds": [], "presets": []}


def fmt_count(n: int) -> str:
    return f"{n:,}"


def round_rows(results: list[dict[str, Any]]) -> tuple[list[str], str]:
    """Table rows of one round and its verdict line."""
    peers = [r for r in results if r["name"] in PEER_SCRIPTS]
    ours = next(r for r in results if r["name"] not in PEER_SCRIPTS)
    fastest = min(peers, key=lambda r: r["sec_per_step"])
    leanest = min(peers, key=lambda r: r["peak_rss_mb"])
    speed = fastest["sec_per_step"] / ours["sec_per_step"]
    rss = ours["peak_rss_mb"] / leanest["peak_rss_mb"]
    rows = [f"| {r['name']} | {r['sec_per_step']:.3f} | {fmt_count(r['params_g'])} | {fmt_count(r['params_d'])} "
            f"| {r['peak_rss_mb']} | {r['load_mean']:.1f} (max {r['load_max']:.1f}) |" for r in results]
    verdict = (f"voicesmith speed = **{speed:.2f}x** the faster peer ({fastest['name']}; target >= {TARGET_SPEED}x: "
               f"{'met' if speed >= TARGET_SPEED else 'missed'}); peak RSS = **{rss:.2f}x** the lower peer "
               f"({leanest['name']}; target <= {TARGET_RSS}x: {'met' if rss <= TARGET_RSS else 'missed'}).")
    return rows, verdict


NOTES = """## How to read this

- The machine is a 2-core VM shared with other engineers' tests and benchmarks. The load column is the
  1-minute load average sampled every 10 s while each trainer ran (the trainer itself adds about 2). With
  two OpenMP threads per trainer, a load above 2 slows every trainer several-fold (the peers' README measured
  3.9-4.0 s/step on a quiet machine), so compare trainers only within a round, never with other days.
- Same model: at this configuration voicesmith's generator has exactly Piper's 5,997,776 parameters when
  built with Piper's 256 symbols (tests/test_bench_vits.py); with its own symbol table (fewer ids) it has
  5,988,464. The discriminator is the peers' 46,747,132. coqui's stochastic duration predictor is wider
  (192 channels), hence its 6.93 M.
- Same work per step: one generator pass, a discriminator update on real + generated segments, a generator
  update; AdamW, fp32, batch 8, 8192-sample segments, the same 256 utterances (3.3-4.1 s), no loader workers.
  voicesmith draws length-bucketed batches; on this subset every batch has about the same length anyway.
- voicesmith runs its full engine (finite-loss guard, clipping, TensorBoard + CSV logging); its first
  checkpoint is written after the last timed step.
- Peak RSS includes start-up and data preparation in every trainer. Piper preprocesses in its training
  process; voicesmith builds its feature cache in spawned worker processes (their own peak is in the
  details as `rss_children_mb`), and its training peak is far above that stage.
"""


def render(data: dict[str, Any]) -> str:
    lines = ["# VITS training speed and memory (CPU)", "",
             f"Machine: {platform.machine()}, {os.cpu_count()} cores shared with other engineers' jobs; "
             f"{platform.python_version()}; torch {data.get('torch', '?')}. Written by `benchmarks/bench_vits.py` "
             "(its docstring gives the measurement; `../shared/bench/peer_vits/README.md` gives the peers' "
             "configuration and data).", ""]
    for index, results in enumerate(data["rounds"], 1):
        rows, verdict = round_rows(results)
        lines += [f"## Round {index}: peer configuration, batch 8, fp32, 26 steps, 256-utterance subset", "",
                  "| trainer | sec/step (median, steps 5..25) | params G | params D | peak RSS MB | load avg 1-min "
                  "during the run |", "|---|---|---|---|---|---|", *rows, "", verdict, ""]
        ours = results[-1]
        lines += [f"voicesmith details: `{ours['detail'][0]}`" if ours["detail"] else "", ""]
    if data["presets"]:
        lines += ["## voicesmith presets on the CPU (fp32, same subset, no loader workers)", "",
                  "| preset | batch | steps | sec/step (median, steps 5..N-1) | steps/s | params G | params D "
                  "| peak RSS MB | load avg 1-min |", "|---|---|---|---|---|---|---|---|---|"]
        for r in data["presets"]:
            lines.append(f"| {r['preset']} | {r['batch']} | {r['steps']} | {r['sec_per_step']:.3f} | "
                         f"{1 / r['sec_per_step']:.3f} | {fmt_count(r['params_g'])} | {fmt_count(r['params_d'])} | "
                         f"{r['peak_rss_mb']} | {r['load_mean']:.1f} (max {r['load_max']:.1f}) |")
        lines.append("")
    return "\n".join(lines + [NOTES])


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", type=Path, help="LJSpeech-layout corpus (e.g. demo-corpus --n 600)")
    parser.add_argument("--work", type=Path, default=Path("/tmp/peerbench"), help="peer venvs, runs, results")
    parser.add_argument("--peer-dir", type=Path, default=DEFAULT_PEER_DIR)
    parser.add_argument("--rounds", type=int, default=1, help="coqui, piper, voicesmith rounds (0: none)")
    parser.add_argument("--steps", type=int, default=26)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--presets", default="", help="PRESET:BATCH:STEPS,... e.g. tiny:8:26,medium:8:10")
    parser.add_argument("--profile", type=int, default=0, help="profile this many voicesmith steps instead")
    parser.add_argument("--out", type=Path, help="write the markdown results here")
    parser.add_argument("--python", type=Path, default=Path(sys.executable),
                        help="the python that trains voicesmith: best one whose environment holds only "
                             "voicesmith's runtime dependencies (`pip install voicesmith`), as each peer runs in "
                             "its own; a dev environment's extras (transformers) are imported by Lightning and "
                             "add about 110 MB of resident memory")
    # the measured process (internal)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--dataset", help=argparse.SUPPRESS)
    parser.add_argument("--run-dir", help=argparse.SUPPRESS)
    parser.add_argument("--name", default="voicesmith-vits", help=argparse.SUPPRESS)
    parser.add_argument("--preset", default="tiny", help=argparse.SUPPRESS)
    parser.add_argument("--peer-config", action="store_true", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main() -> None:
    args = parse_args()
    if args.child:
        return child(args)
    if args.corpus is None:
        raise SystemExit("--corpus is required: an LJSpeech-layout corpus, e.g. `voicesmith demo-corpus DIR --n 600`")
    args.work.mkdir(parents=True, exist_ok=True)
    dataset = make_dataset(args.corpus, args.work, args.peer_dir)
    if args.profile:
        return profile(args, dataset)
    store = args.work / "bench_vits.json"
    data = load_results(store)
    for _ in range(args.rounds):
        data["rounds"].append(compare_round(args, dataset))
        store.write_text(json.dumps(data, indent=1), encoding="utf-8")
    if args.presets:
        data["presets"] = run_presets(args, dataset)
        store.write_text(json.dumps(data, indent=1), encoding="utf-8")
    import torch

    data["torch"] = torch.__version__
    store.write_text(json.dumps(data, indent=1), encoding="utf-8")
    if args.out:
        args.out.write_text(render(data), encoding="utf-8")
        print(f"wrote {args.out}")
    for results in data["rounds"]:
        print(round_rows(results)[1])


if __name__ == "__main__":
    main()
