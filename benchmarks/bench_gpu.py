"""Checks and figures that need an NVIDIA GPU, all in one invocation (a lent GPU is held for minutes).

Sections (each runs even when an earlier one fails; failures are reported, never hidden):
- cuda_tests: the suite's CUDA-only tests.
- mas: alignment search as a torch wavefront on the GPU against the numba kernel on the host's CPU,
  the paths compared element for element.
- vits: VITS training speed and peak GPU memory for presets at fp32 and bf16-mixed, each in a fresh
  process (a training step: a discriminator and a generator update; median of steps 5..N-1, synchronised).
- ddp: a VITS run under torchrun with the DDP strategy on the GPU (NCCL), one rank per GPU there is.
- vocoder: HiFi-GAN V1 against the Vocos-style generator, inference real-time factor on the GPU.
- e2e: `voicesmith init`, `train` (bf16-mixed, samples and evaluation at the end), `synth`, `export`.

    python benchmarks/bench_gpu.py --work /tmp/gpu --out OUT_DIR   # OUT_DIR/gpu.json, gpu.md, logs.tar.gz
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

VITS_CASES = [("tiny", 16, "32"), ("tiny", 16, "bf16-mixed"), ("medium", 16, "32"), ("medium", 16, "bf16-mixed"),
              ("medium", 32, "bf16-mixed")]
MAS_CASES = [(16, 150, 1000), (32, 300, 2000), (64, 400, 3000)]
GPU_RUN = ["hardware.accelerator=cuda", "data.num_workers=4", "data.trim_silence=false", "samples.every_n_steps=0",
           "samples.on_best=false", "eval.every_n_steps=0", "train.val_every_n_steps=1000000",
           "train.checkpoint_every_n_steps=1000000", "logging.progress_bar=false"]


def sh(command: list[str], log: Path, timeout: float, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run a command, keep its whole output in `log`, and fail loudly with its tail."""
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)
    log.write_text(done.stdout + done.stderr, encoding="utf-8")
    if done.returncode:
        raise RuntimeError(f"{' '.join(command)} exited {done.returncode}:\n{(done.stdout + done.stderr)[-2500:]}")
    return done


# --- sections ------------------------------------------------------------------------------------------

def env_section(work: Path, out: Path, corpus: Path) -> dict:
    import torch

    props = torch.cuda.get_device_properties(0)
    return {"gpu": props.name, "gpu_memory_gb": round(props.total_memory / 2**30, 1), "torch": torch.__version__,
            "cuda": torch.version.cuda, "cpu_cores": os.cpu_count(), "python": platform.python_version()}


def cuda_tests_section(work: Path, out: Path, corpus: Path) -> dict:
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_audio.py",
                           "tests/test_griffin_lim.py", "-k", "cuda", "-rs"], capture_output=True, text=True)
    (out / "cuda_tests.log").write_text(done.stdout + done.stderr, encoding="utf-8")
    last = (done.stdout.strip().splitlines() or ["no output"])[-1]
    if done.returncode:
        raise RuntimeError(f"CUDA tests failed: {done.stdout[-2500:]}")
    return {"result": last}


def mas_section(work: Path, out: Path, corpus: Path) -> dict:
    import torch

    from voicesmith.align import maximum_path_numba, maximum_path_torch

    rows = []
    for batch, n_tokens, n_frames in MAS_CASES:
        g = torch.Generator().manual_seed(batch + n_tokens + n_frames)
        scores = torch.randn(batch, n_tokens, n_frames, generator=g)
        text_lengths = torch.randint(n_tokens // 2, n_tokens + 1, (batch,), generator=g)
        text_lengths[0] = n_tokens
        mel_lengths = torch.clamp(text_lengths * (n_frames // n_tokens), max=n_frames)
        mel_lengths[0] = n_frames
        on_gpu = scores.cuda(), text_lengths.cuda(), mel_lengths.cuda()
        gpu_path = maximum_path_torch(*on_gpu)
        cpu_path = maximum_path_numba(scores, text_lengths, mel_lengths)
        rows.append({"case": f"B={batch}, text {n_tokens}, mel {n_frames}",
                     "identical": bool(torch.equal(gpu_path.cpu(), cpu_path)),
                     "gpu_wavefront_ms": median_ms(lambda: maximum_path_torch(*on_gpu), cuda=True),
                     "cpu_numba_ms": median_ms(lambda: maximum_path_numba(scores, text_lengths, mel_lengths)),
                     "cpu_threads": torch.get_num_threads()})
        print("mas", rows[-1], flush=True)
    return {"rows": rows}


def median_ms(run: Callable[[], Any], repeats: int = 7, cuda: bool = False) -> float:
    import torch

    times = []
    for _ in range(repeats + 1):
        if cuda:
            torch.cuda.synchronize()
        started = time.perf_counter()
        run()
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - started)
    return round(statistics.median(times[1:]) * 1000, 2)


def vits_section(work: Path, out: Path, corpus: Path) -> dict:
    rows = []
    for preset, batch, precision in VITS_CASES:
        log = out / f"vits_{preset}_{batch}_{precision}.log"
        try:
            done = sh([sys.executable, __file__, "--child-vits", "--corpus", str(corpus), "--work", str(work),
                       "--preset", preset, "--batch", str(batch), "--precision", precision], log, timeout=240)
            row = json.loads(done.stdout.strip().splitlines()[-1])
        except Exception as error:  # one case failing must not hide the others
            row = {"preset": preset, "batch": batch, "precision": precision, "error": str(error)[-1500:]}
        print("vits", row, flush=True)
        rows.append(row)
    return {"rows": rows}


def child_vits(args: argparse.Namespace) -> None:
    """One measured VITS run in this process; prints one JSON line."""
    import torch
    from lightning.pytorch.callbacks import Callback

    from voicesmith.config import apply_override, preset_dict, validate_config
    from voicesmith.training import train

    run_dir = args.work / f"vits_{args.preset}_{args.batch}_{args.precision}"
    raw = preset_dict(args.preset, str(args.corpus), "vits")
    for item in [*GPU_RUN, f"hardware.precision='{args.precision}'", f"train.batch_size={args.batch}",
                 f"data.cache_dir={args.work / 'cache'}"]:
        apply_override(raw, item)
    config = validate_config(raw, source="bench_gpu")
    config.save(run_dir / "config.yaml")

    class SyncedTimer(Callback):
        def __init__(self):
            self.marks: list[float] = []
            self.params: dict[str, int] = {}

        def on_train_start(self, trainer, pl_module) -> None:
            self.params = pl_module.model.parameter_counts()

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            torch.cuda.synchronize()
            self.marks.append(time.perf_counter())

    timer = SyncedTimer()
    StepProfiler = make_step_profiler()
    callbacks = [timer, StepProfiler(args.work / "logs" / f"profile_{run_dir.name}.txt")] if args.profile else [timer]
    summary = train(config, resume="never", max_steps=args.steps, callbacks=callbacks)
    steps = [b - a for a, b in zip(timer.marks, timer.marks[1:])]
    losses = summary.get("last_losses") or {}
    print(json.dumps({"preset": args.preset, "batch": args.batch, "precision": args.precision,
                      "steps": len(timer.marks), "status": summary.get("status"),
                      "sec_per_step": round(statistics.median(steps[3:]), 4),
                      "peak_gpu_allocated_gb": round(torch.cuda.max_memory_allocated() / 2**30, 2),
                      "peak_gpu_reserved_gb": round(torch.cuda.max_memory_reserved() / 2**30, 2),
                      "batches_skipped": summary.get("batches_skipped"),
                      "losses_finite": bool(losses) and all(v == v and abs(v) != float("inf") for v in losses.values()),
                      "last_losses": losses, "params": timer.params}))


def make_step_profiler():
    """torch.profiler over steps 10..14: where a GPU step's time goes (kernels, or the host launching them)."""
    import torch
    from lightning.pytorch.callbacks import Callback

    class StepProfiler(Callback):
        def __init__(self, path: Path, first: int = 10, steps: int = 5):
            self.path, self.first, self.last = path, first, first + steps
            self.profiler = None
            self.started = 0.0

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
            if trainer.global_step == self.first:
                torch.cuda.synchronize()
                self.started = time.perf_counter()
                activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
                self.profiler = torch.profiler.profile(activities=activities)
                self.profiler.__enter__()

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            if trainer.global_step == self.last and self.profiler is not None:
                torch.cuda.synchronize()
                wall = time.perf_counter() - self.started
                self.profiler.__exit__(None, None, None)
                events = self.profiler.key_averages()
                kernel_us = sum(e.self_device_time_total for e in events)
                head = (f"{self.last - self.first} steps: wall {wall:.3f} s, GPU kernels {kernel_us / 1e6:.3f} s "
                        f"({100 * kernel_us / 1e6 / wall:.0f}% busy)\n")
                self.path.write_text(head + events.table(sort_by="self_device_time_total", row_limit=25) +
                                     events.table(sort_by="self_cpu_time_total", row_limit=25), encoding="utf-8")
                print(head, file=sys.stderr)
                self.profiler = None

    return StepProfiler


def ddp_section(work: Path, out: Path, corpus: Path) -> dict:
    import torch

    run_dir = work / "ddp"
    config = init(corpus, run_dir, "tiny", out / "ddp_init.log",
                  ["hardware.strategy=ddp", "hardware.accelerator=cuda", "hardware.precision='bf16-mixed'",
                   "train.batch_size=8", *GPU_RUN[1:]])
    ranks = torch.cuda.device_count()
    sh([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(ranks),
        "-m", "voicesmith.cli", "train", str(config), "--max-steps", "20"], out / "ddp.log", timeout=300)
    summary = json.loads((run_dir / "summary.json").read_text())
    return {"ranks": ranks, "backend": "nccl", "status": summary["status"], "world_size": summary.get("world_size"),
            "global_step": summary["global_step"], "batches_skipped": summary.get("batches_skipped")}


def init(corpus: Path, run_dir: Path, preset: str, log: Path, overrides: list[str]) -> Path:
    command = [sys.executable, "-m", "voicesmith.cli", "init", str(corpus), str(run_dir), "--model", "vits",
               "--preset", preset, "--force"]
    for item in overrides:
        command += ["--set", item]
    sh(command, log, timeout=120)
    return run_dir / "config.yaml"


def vocoder_section(work: Path, out: Path, corpus: Path) -> dict:
    import torch

    from voicesmith.config import make_config
    from voicesmith.models.vocoder import build_generator

    rows = {}
    for preset in ("hifigan-v1", "vocos"):
        config = make_config(str(corpus), preset, "vocoder")
        generator = build_generator(config.model, config.audio).eval().cuda()
        generator.remove_weight_norm()
        seconds = 10.0
        frames = round(seconds * config.audio.sample_rate / config.audio.hop_length)
        mel = torch.randn(1, config.audio.n_mels, frames, device="cuda") - 5
        row = {}
        for precision, dtype in (("32", None), ("bf16", torch.bfloat16)):
            def run() -> None:
                with torch.no_grad(), torch.autocast("cuda", dtype=dtype or torch.float32, enabled=dtype is not None):
                    generator(mel)
            run()
            row[f"rtf_{precision}"] = round(median_ms(run, repeats=10, cuda=True) / 1000 / seconds, 6)
        rows[preset] = row
        print("vocoder", preset, row, flush=True)
    rows["vocos_speedup_fp32"] = round(rows["hifigan-v1"]["rtf_32"] / rows["vocos"]["rtf_32"], 1)
    return rows


def e2e_section(work: Path, out: Path, corpus: Path) -> dict:
    run_dir = work / "e2e"
    config = init(corpus, run_dir, "tiny", out / "e2e_init.log",
                  ["hardware.accelerator=cuda", "hardware.precision='bf16-mixed'", "data.num_workers=4",
                   "train.batch_size=16", "samples.every_n_steps=200", "eval.every_n_steps=0"])
    started = time.perf_counter()
    sh([sys.executable, "-m", "voicesmith.cli", "train", str(config), "--max-steps", "400"], out / "e2e_train.log",
       timeout=420)
    train_seconds = time.perf_counter() - started
    summary = json.loads((run_dir / "summary.json").read_text())
    sh([sys.executable, "-m", "voicesmith.cli", "synth", str(run_dir), "The quick brown fox jumps over the lazy dog.",
        "-o", str(out / "e2e_sample.wav")], out / "e2e_synth.log", timeout=120)
    sh([sys.executable, "-m", "voicesmith.cli", "export", str(run_dir), "-o", str(work / "e2e.onnx")],
       out / "e2e_export.log", timeout=240)
    return {"status": summary["status"], "global_step": summary["global_step"], "train_seconds": round(train_seconds),
            "last_losses": summary.get("last_losses"), "batches_skipped": summary.get("batches_skipped"),
            "samples": sorted(p.name for p in (run_dir / "samples").rglob("*.wav"))[:6] if (run_dir / "samples").exists()
            else [], "exported_mb": round((work / "e2e.onnx").stat().st_size / 2**20, 1)}


def profile_section(work: Path, out: Path, corpus: Path) -> dict:
    rows = {}
    for preset in ("tiny", "medium"):
        log = out / f"vits_profile_{preset}.log"
        sh([sys.executable, __file__, "--child-vits", "--corpus", str(corpus), "--work", str(work), "--preset", preset,
            "--batch", "16", "--precision", "32", "--steps", "16", "--profile"], log, timeout=240)
        rows[preset] = next(line for line in log.read_text().splitlines() if line.startswith("5 steps: wall"))
    return rows


SECTIONS = {"env": env_section, "cuda_tests": cuda_tests_section, "mas": mas_section, "vits": vits_section,
            "vocoder": vocoder_section, "ddp": ddp_section, "e2e": e2e_section,
            "profile": profile_section}


def markdown(result: dict) -> str:
    env = result.get("env", {})
    lines = [f"# GPU checks\n\n`python benchmarks/bench_gpu.py`: {env.get('gpu')} ({env.get('gpu_memory_gb')} GiB), "
             f"{env.get('cpu_cores')} CPU cores, torch {env.get('torch')} (CUDA {env.get('cuda')}).", ""]
    for name, value in result.items():
        if isinstance(value, dict) and "error" in value:
            lines += [f"**{name} failed**: `{value['error'][-400:]}`", ""]
    if "rows" in result.get("vits", {}):
        lines += ["## VITS training on the GPU", "", "| preset | batch | precision | s/step | steps/s | peak GPU "
                  "allocated (GiB) | reserved (GiB) | losses finite | skipped |", "|---|---|---|---|---|---|---|---|---|"]
        for row in result["vits"]["rows"]:
            if "error" in row:
                lines.append(f"| {row['preset']} | {row['batch']} | {row['precision']} | failed | | | | | |")
                continue
            lines.append(f"| {row['preset']} | {row['batch']} | {row['precision']} | {row['sec_per_step']:.3f} | "
                         f"{1 / row['sec_per_step']:.2f} | {row['peak_gpu_allocated_gb']} | "
                         f"{row['peak_gpu_reserved_gb']} | {row['losses_finite']} | {row['batches_skipped']} |")
        lines.append("")
    if "rows" in result.get("mas", {}):
        lines += ["## Alignment search", "", "| case | torch wavefront, GPU (ms) | numba, CPU (ms, threads) | "
                  "identical paths |", "|---|---|---|---|"]
        lines += [f"| {r['case']} | {r['gpu_wavefront_ms']} | {r['cpu_numba_ms']} ({r['cpu_threads']}) | "
                  f"{r['identical']} |" for r in result["mas"]["rows"]]
        lines.append("")
    if "vocos" in result.get("vocoder", {}):
        v = result["vocoder"]
        lines += ["## Vocoder inference (10 s of audio, batch 1)", "", "| generator | RTF fp32 | RTF bf16 autocast |",
                  "|---|---|---|", *[f"| {p} | {v[p]['rtf_32']} | {v[p]['rtf_bf16']} |" for p in ("hifigan-v1", "vocos")],
                  "", f"Vocos-style over HiFi-GAN V1 at fp32: {v['vocos_speedup_fp32']}x faster.", ""]
    for name in ("cuda_tests", "ddp", "e2e", "profile"):
        if name in result and "error" not in result[name]:
            lines += [f"## {name}", "", "```", json.dumps(result[name], indent=1), "```", ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, default=Path("/tmp/bench_gpu"))
    parser.add_argument("--out", type=Path, default=Path("/tmp/bench_gpu/out"))
    parser.add_argument("--corpus", type=Path, help="an existing corpus (default: WORK/corpus, made here)")
    parser.add_argument("--items", type=int, default=200)
    parser.add_argument("--only", default="", help="comma-separated sections")
    parser.add_argument("--child-vits", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--preset", default="tiny", help=argparse.SUPPRESS)
    parser.add_argument("--batch", type=int, default=16, help=argparse.SUPPRESS)
    parser.add_argument("--precision", default="32", help=argparse.SUPPRESS)
    parser.add_argument("--steps", type=int, default=30, help=argparse.SUPPRESS)
    parser.add_argument("--profile", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child_vits:
        return child_vits(args)
    args.work.mkdir(parents=True, exist_ok=True)
    args.out.mkdir(parents=True, exist_ok=True)
    logs = args.work / "logs"  # every command's whole output; packed into OUT/logs.tar.gz at the end
    logs.mkdir(exist_ok=True)
    corpus = args.corpus or args.work / "corpus"
    if not corpus.exists():
        from voicesmith.demo_corpus import write_demo_corpus

        write_demo_corpus(corpus, n=args.items)
    result: dict[str, Any] = {}
    for name, section in SECTIONS.items():
        if args.only and name not in args.only.split(","):
            continue
        started = time.perf_counter()
        try:
            result[name] = section(args.work, logs, corpus)
        except Exception:
            result[name] = {"error": traceback.format_exc()[-3000:]}
        result[name]["seconds"] = round(time.perf_counter() - started, 1)
        print(f"== {name} ({result[name]['seconds']} s)", json.dumps(result[name])[:1500], flush=True)
        (args.out / "gpu.json").write_text(json.dumps(result, indent=1), encoding="utf-8")
    (args.out / "gpu.md").write_text(markdown(result), encoding="utf-8")
    shutil.make_archive(str(args.out / "logs"), "gztar", logs)
    print(markdown(result))


if __name__ == "__main__":
    main()
