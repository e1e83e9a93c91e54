"""What the side-by-side benchmarks (throughput_vs_pytorch.py, gpt_vs_pytorch.py) share: the machine's CPU line, its
measured SGEMM peak, the PyTorch interpreters to compare against, and the table they print and write as JSON.

The peak is OpenBLAS's own cblas_sgemm (the fastest fp32 matrix product this machine has) on a 2048 × 2048 × 2048
product with 2 threads, the most threads any engine of these benchmarks uses: its packing is O(n²) against O(n³)
arithmetic, so at this size the kernel runs at its steady rate (on this machine 1024³ gives ~7 % less and 4096³ the
same within noise at 8× the time). It is measured once per round, interleaved with the engines, and the median is the
peak every engine's achieved GFLOP/s is shared against.
"""
import datetime
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.path.join(ROOT, "build")
GPUTRAIN = os.path.join(BUILD, "gputrain")
DEBIAN_PY = "/usr/bin/python3"
VENV_PY = os.path.join(ROOT, "bench", ".venv", "bin", "python")
PEAK_N, PEAK_THREADS = 2048, 2
PEAK_WHAT = (f"SGEMM {PEAK_N}x{PEAK_N}x{PEAK_N} fp32, {PEAK_THREADS} threads, the best of OpenBLAS (the core it "
             "picks, and its newest core this CPU runs: SkylakeX with AVX-512, Haswell with AVX2) and gputrain's own "
             "kernels (bench_gemm_rate: best of 3 calls after a warm-up call)")


def machine():
    """The CPU entry of `gputrain devices`: its first line and the indented lines under it (OpenBLAS build and core,
    the bf16/fp16 instructions), which say what the peak below is the peak of."""
    out = subprocess.run([GPUTRAIN, "devices"], check=True, capture_output=True, text=True).stdout.splitlines()
    start = next(i for i, line in enumerate(out) if line.startswith("cpu:"))
    block = [out[start]]
    for line in out[start + 1:]:
        if not line.startswith(" "):
            break
        block.append(line.strip())
    return block


def torch_pythons(notes):
    """[(python, name)]: Debian's torch, then PyPI's from bench/.venv (made by bench/torch_venv.sh). One that is
    missing or cannot import torch is skipped with a line in `notes`."""
    found = []
    for py, origin, how in ((DEBIAN_PY, "Debian", "scripts/setup.sh installs python3-torch"),
                            (VENV_PY, "PyPI", "bench/torch_venv.sh makes bench/.venv")):
        if not os.path.exists(py):
            notes.append(f"no {origin} PyTorch: {os.path.relpath(py, ROOT) if py == VENV_PY else py} is missing "
                         f"({how})")
            continue
        r = subprocess.run([py, "-c", "import torch; print(torch.__version__)"], capture_output=True, text=True)
        if r.returncode != 0:
            last = (r.stderr.strip().splitlines() or ["?"])[-1]
            notes.append(f"no {origin} PyTorch: {py} cannot import torch ({last})")
            continue
        found.append((py, f"PyTorch {r.stdout.strip()} ({origin})"))
    if not found:
        raise SystemExit("no PyTorch to compare against: " + "; ".join(notes))
    return found


def strongest_openblas_core():
    """OpenBLAS's newest kernel family the CPU runs (its DYNAMIC_ARCH picks by CPU model and may fall back to an old
    one on a model it does not know, as 0.3.21 does on an Intel Xeon of family 6, model 207): the peak must not be
    that fallback's."""
    flags = open("/proc/cpuinfo").read()
    if " avx512f" in flags:
        return "SkylakeX"
    if " avx2" in flags and " fma" in flags:
        return "Haswell"
    return None


def sgemm_peak():
    best = 0.0
    core = strongest_openblas_core()
    for env in [None] + ([{**os.environ, "OPENBLAS_CORETYPE": core}] if core else []):
        out = subprocess.run([os.path.join(BUILD, "bench_gemm_rate"), str(PEAK_THREADS), str(PEAK_N)], check=True,
                             capture_output=True, text=True, env=env)
        best = max(best, json.loads(out.stdout)["gflops"])
    return best


def check_json_path(ap, path):
    """Fails at the start, not after the rounds, when --json names a folder that does not exist."""
    if path and not os.path.isdir(os.path.dirname(os.path.abspath(path))):
        ap.error(f"--json {path}: its folder does not exist")


def threads_label(n):
    return f"{n} thread{'s' if n != 1 else ''}"


class Row:
    """One engine in one mode: its rate in every round and the FLOPs one unit (sample, token) costs."""

    def __init__(self, engine, mode, threads, unit, flops, ours=False):
        self.engine, self.mode, self.threads, self.unit, self.flops, self.ours = engine, mode, threads, unit, flops, ours
        self.rounds = []

    @property
    def label(self):
        return f"{self.engine}, {threads_label(self.threads)}"

    def rate(self):
        return statistics.median(self.rounds)


def rotated(items, r):
    """Round r runs the engines starting at the r-th, so that no one engine always runs first, right after the peak's
    product has heated the cores (the cyclic order itself stays the same)."""
    k = r % len(items)
    return items[k:] + items[:k]


class Report:
    """The table of one benchmark run: its rows by mode, the peak's rounds, notes, and the speed targets per mode
    (mode: (ratio to the fastest PyTorch, share of the peak or None))."""

    def __init__(self, bench, title, rounds, modes, targets):
        self.bench, self.title, self.n_rounds, self.modes, self.targets = bench, title, rounds, modes, targets
        self.machine = machine()
        self.rows, self.peak_rounds, self.notes = [], [], []

    def add(self, row):
        self.rows.append(row)
        return row

    def rounds_text(self):
        return f"{self.n_rounds} round{'s' if self.n_rounds != 1 else ''}"

    def peak(self):
        return statistics.median(self.peak_rounds)

    def fastest_torch(self, mode):
        return max((r for r in self.rows if r.mode == mode and not r.ours), key=Row.rate)

    def entries(self):
        """The table as dicts: the median rate, achieved GFLOP/s, its share of the peak, and the rate over the fastest
        PyTorch's of the same mode (gputrain's row: the ratio of the speed targets; the fastest PyTorch's: 1)."""
        out = []
        for r in self.rows:
            gflops = r.rate() * r.flops * 1e-9
            out.append({"engine": r.engine, "mode": r.mode, "threads": r.threads, "unit": f"{r.unit}/s",
                        "rate": r.rate(), "gflops": gflops, "share_of_peak": gflops / self.peak(),
                        "ratio": r.rate() / self.fastest_torch(r.mode).rate(), "rounds": r.rounds,
                        "flops_per_unit": r.flops})
        return out

    def summary(self):
        out = {}
        for mode, (ratio_target, share_target) in self.targets.items():
            ours = next(r for r in self.rows if r.mode == mode and r.ours)
            fastest = self.fastest_torch(mode)
            out[mode] = {"ratio": ours.rate() / fastest.rate(), "against": fastest.label, "ratio_target": ratio_target,
                         "share_of_peak": ours.rate() * ours.flops * 1e-9 / self.peak(), "share_target": share_target}
        return out

    def print_header(self):
        """The machine, the title and the notes: printed before the rounds start."""
        print(self.machine[0])
        for line in self.machine[1:]:
            print(f"     {line}")
        print(self.title)
        for note in self.notes:
            print(f"note: {note}")
        sys.stdout.flush()

    def print_table(self):
        print(f"peak: {PEAK_WHAT}: {self.peak():.1f} GFLOP/s (median of {self.rounds_text()}: " +
              ", ".join(f"{p:.1f}" for p in self.peak_rounds) + ")")
        entries = self.entries()
        width = max(max(len(r.label) + 4 for r in self.rows),
                    max(len(f"{h} (median of {self.rounds_text()})") + 1 for h in self.modes.values()))
        for mode, heading in self.modes.items():
            unit = next(r.unit for r in self.rows if r.mode == mode) + "/s"
            print(f"{heading + f' (median of {self.rounds_text()})':<{width}}"
                  f"{unit:>12}{'GFLOP/s':>10}{'% of peak':>11}{'vs fastest PyTorch':>20}")
            for r, e in zip(self.rows, entries):
                if r.mode == mode:
                    print(f"  {r.label:<{width - 2}}{e['rate']:>12,.0f}{e['gflops']:>10.1f}"
                          f"{100 * e['share_of_peak']:>10.1f}%{e['ratio']:>19.2f}x")
        for mode, s in self.summary().items():
            share = f"gputrain at {100 * s['share_of_peak']:.1f} % of peak"
            if s["share_target"]:
                share += f" (target >= {100 * s['share_target']:.0f} %)"
            print(f"{self.modes[mode]}: gputrain / fastest PyTorch ({s['against']}) = {s['ratio']:.2f}x "
                  f"(target >= {s['ratio_target']}x); {share}")

    def write_json(self, path, extra):
        commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True).stdout.strip()
        doc = {"bench": self.bench, "title": self.title,
               "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               "commit": commit or None, "machine": self.machine, "rounds": self.n_rounds,
               "peak": {"what": PEAK_WHAT, "gflops": self.peak(), "rounds": self.peak_rounds}, **extra,
               "rows": self.entries(), "summary": self.summary(), "notes": self.notes}
        with open(path, "w") as f:
            json.dump(doc, f, indent=1)
            f.write("\n")
