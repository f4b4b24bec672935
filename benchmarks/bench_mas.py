"""Monotonic alignment search: voicesmith against the Cython reference from PyPI.

    pip install monotonic-align      # benchmark-only dependency (the VITS core.pyx, built by pip)
    python benchmarks/bench_mas.py   # prints the table and writes benchmarks/RESULTS_mas.md

Every implementation sees the same float32 scores at full lengths; the reference gets
them in its own layout ([B, T_mel, T_text], made before timing), voicesmith in its own
([B, T_text, T_mel]). Implementations take turns within each round, so a burst of load
from other processes hits all of them alike; the table reports the median round.
Each run starts after a 50 ms pause: torch's OpenMP workers spin for milliseconds after
an op, and the run that came next would share its cores with them.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numba
import numpy as np
import torch

from voicesmith.align import maximum_path, maximum_path_numba, maximum_path_torch

try:
    import monotonic_align
    from monotonic_align.core import maximum_path_c
except ImportError:
    sys.exit("bench_mas.py needs the reference: pip install monotonic-align")

CASES = [(16, 150, 1000), (32, 300, 2000)]


def make_case(batch: int, n_tokens: int, n_frames: int) -> dict:
    g = torch.Generator().manual_seed(batch * n_tokens + n_frames)
    log_p = torch.randn(batch, n_tokens, n_frames, generator=g)
    return {
        "log_p": log_p,
        "text": torch.full((batch,), n_tokens),
        "mel": torch.full((batch,), n_frames),
        "ref_log_p": log_p.transpose(1, 2).contiguous(),
        "ref_mask": torch.ones(batch, n_frames, n_tokens),
    }


def implementations(case: dict) -> dict:
    """name -> (setup, run): setup's result goes to run, and only run is timed."""
    log_p, text, mel = case["log_p"], case["text"], case["mel"]
    ref_lengths = (mel.int().numpy(), text.int().numpy())

    def ref_kernel_setup():  # the kernel works in place: fresh buffers each time, untimed
        return np.zeros(case["ref_log_p"].shape, np.int32), case["ref_log_p"].numpy().copy()

    def one_thread(_):
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            return maximum_path_numba(log_p, text, mel)
        finally:
            torch.set_num_threads(threads)

    impls = {
        "reference `monotonic_align.maximum_path` (Cython)": (
            None,
            lambda _: monotonic_align.maximum_path(case["ref_log_p"], case["ref_mask"]),
        ),
        "reference kernel alone (`maximum_path_c`, no copies)": (
            ref_kernel_setup,
            lambda bufs: maximum_path_c(*bufs, *ref_lengths),
        ),
        f"voicesmith `maximum_path` (numba, {torch.get_num_threads()} threads)": (
            None,
            lambda _: maximum_path(log_p, text, mel),
        ),
        "voicesmith numba, 1 thread": (None, one_thread),
        "voicesmith torch wavefront, CPU": (None, lambda _: maximum_path_torch(log_p, text, mel)),
    }
    if torch.cuda.is_available():
        gpu = [t.cuda() for t in (log_p, text, mel)]

        def run_gpu(_):
            path = maximum_path_torch(*gpu)  # stays on the GPU: no device-to-host copy
            torch.cuda.synchronize()
            return path

        impls[f"voicesmith torch wavefront, {torch.cuda.get_device_name()}"] = (torch.cuda.synchronize, run_gpu)
    return impls


def time_rounds(impls: dict, repeats: int) -> dict:
    """name -> (median wall ms, best wall ms, median CPU ms of all threads)."""
    wall = {name: [] for name in impls}
    cpu = {name: [] for name in impls}
    for name, (setup, run) in impls.items():  # warm-up: numba compiles or loads its cache here
        run(setup() if setup else None)
    for _ in range(repeats):
        for name, (setup, run) in impls.items():
            arg = setup() if setup else None
            time.sleep(0.05)  # let torch's OpenMP workers, spinning after the last op, go idle
            start, start_cpu = time.perf_counter(), time.process_time()
            run(arg)
            wall[name].append(time.perf_counter() - start)
            cpu[name].append(time.process_time() - start_cpu)
    return {
        name: (statistics.median(wall[name]) * 1e3, min(wall[name]) * 1e3, statistics.median(cpu[name]) * 1e3)
        for name in impls
    }


def identical_paths(case: dict) -> bool:
    ours = maximum_path(case["log_p"], case["text"], case["mel"])
    reference = monotonic_align.maximum_path(case["ref_log_p"], case["ref_mask"]).transpose(1, 2)
    wavefront = maximum_path_torch(case["log_p"], case["text"], case["mel"])
    return torch.equal(ours, reference) and torch.equal(ours, wavefront)


def machine() -> str:
    model = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        names = [
            line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines() if line.startswith("model name")
        ]
        model = names[0] if names else model
    openmp = b"GOMP_" in Path(sys.modules["monotonic_align.core"].__file__).read_bytes()
    return (
        f"{model}, {os.cpu_count()} cores; Python {platform.python_version()}, torch {torch.__version__}, "
        f"numba {numba.__version__}, {torch.get_num_threads()} threads; "
        f"monotonic-align built {'with' if openmp else 'without'} OpenMP"
        + ("" if openmp else " (as pip builds its sdist), so its prange runs on one core")
        + f". Load average at the end: {os.getloadavg()[0]:.1f}."
    )


def table(results: list[tuple[tuple, dict, bool]]) -> str:
    lines = [
        "| case | implementation | median ms | best ms | CPU ms | x reference | x reference kernel |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for (batch, n_tokens, n_frames), times, same in results:
        api, kernel = (times[name][0] for name in list(times)[:2])
        case = f"B={batch}, text {n_tokens}, mel {n_frames}"
        for name, (median, best, cpu) in times.items():
            lines.append(
                f"| {case} | {name} | {median:.1f} | {best:.1f} | {cpu:.1f} | {api / median:.2f} | {kernel / median:.2f} |"
            )
        lines.append(
            f"| {case} | identical paths (numba, torch wavefront, reference) | {'yes' if same else '**NO**'} | | | | |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=9, help="timed rounds per case (median reported)")
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("RESULTS_mas.md"))
    args = parser.parse_args()
    results = []
    for shape in CASES:
        case = make_case(*shape)
        results.append((shape, time_rounds(implementations(case), args.repeats), identical_paths(case)))
        print(f"done {shape}", file=sys.stderr)
    text = (
        "# Monotonic alignment search: speed\n\n"
        f"`python benchmarks/bench_mas.py` ({args.repeats} rounds, median wall time, full lengths, float32).\n"
        f"Machine: {machine()}\n\n"
        f"{table(results)}\n\n"
        "Wall time: median and best round. CPU ms: process CPU time, all threads, median round; on a loaded "
        "machine it shows the work each one does where wall time also shows the waiting. x reference: the reference's "
        "public `maximum_path` median wall time over this row's (its copies, mask sums and int32 output included, as a "
        "training step pays them); x reference kernel: the same for its Cython loop alone, on buffers made before "
        "the clock starts.\n"
    )
    if not torch.cuda.is_available():
        text += "\nNo GPU on this machine, so no row for the torch wavefront on a GPU (timed there without a device-to-host copy).\n"
    print(text)
    args.out.write_text(text)
    if not all(ok for *_, ok in results):
        sys.exit("paths differ from the reference")


if __name__ == "__main__":
    main()
