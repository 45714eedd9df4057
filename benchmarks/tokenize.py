"""Memory and throughput of `tuneline data preprocess`, as a user runs it, against the raw tokenizer.

    python benchmarks/tokenize.py [--tokenizer ../shared/tokenizers/qwen2.5] [--workers 1] [--memory-only]

Memory: generated alpaca rows (20,000 and 200,000, the same rows as a JSON list and as JSON lines,
in a temporary folder) go through the whole `tuneline data preprocess` command (qwen template,
cutoff_len 1024) under `/usr/bin/time -v`. The peak RSS of the process tree is time's maximum RSS
of the command's own process plus, for each process it starts (encoding workers), the last high
water mark (VmHWM) read from /proc while it ran, sampled every 20 ms: a sum of peaks, so an upper
bound of the peak of the sum, with no cgroup needed. The table gives it per size and format and
the ratio 200k/20k; the goal is at most 1.2x for both formats.

Throughput (unless --memory-only), on the JSON lines: rows/s of `tuneline data preprocess`
(reading, rendering, encoding, labels, Arrow output and the tokenizer's loading, in a fresh child
process whose module imports are done before the clock starts); rows/s of the raw
`tokenizer(texts)` call on the same rendered text, the ceiling since preprocessing must at least
encode that text; their ratio.
"""

from __future__ import annotations

import os
import sys

# This file's name shadows the standard library's `tokenize` (which inspect and linecache import)
# when it runs as a script, so its own folder leaves the import path first.
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(os.path.abspath(__file__))]

import argparse
import gc
import json
import random
import re
import subprocess
import tempfile
import threading
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
SIZES = (20_000, 200_000)
FORMATS = {"json list": "bench.json", "json lines": "bench.jsonl"}
GOAL_RATIO = 1.2
SAMPLE_SECONDS = 0.02
QUIET = {"HF_HUB_OFFLINE": "1", "DO_NOT_TRACK": "true", "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
         "MLFLOW_DISABLE_TELEMETRY": "true"}
WORDS = ("model data train token answer question river mountain city green blue quick slow small large "
         "bright dark early late north south water fire light sound number letter story").split()


def alpaca_rows(count: int, *, seed: int = 0):
    draw = random.Random(seed)
    sentence = lambda n: " ".join(draw.choice(WORDS) for _ in range(n)).capitalize() + "."  # noqa: E731
    for _ in range(count):
        yield {"instruction": sentence(draw.randint(8, 40)), "input": sentence(draw.randint(0, 20)) if draw.random() < 0.3 else "",
               "output": " ".join(sentence(draw.randint(5, 25)) for _ in range(draw.randint(1, 6)))}


def write_dataset(folder: Path, rows: int) -> None:
    """The same rows as a JSON list (`bench_list`) and as JSON lines (`bench`), one object a line in both."""
    with (folder / FORMATS["json list"]).open("w", encoding="utf-8") as listed, \
            (folder / FORMATS["json lines"]).open("w", encoding="utf-8") as lines:
        listed.write("[\n")
        for index, row in enumerate(alpaca_rows(rows)):
            text = json.dumps(row)
            listed.write(("" if index == 0 else ",\n") + text)
            lines.write(text + "\n")
        listed.write("\n]\n")
    (folder / "dataset_info.json").write_text(json.dumps({
        "bench": {"file_name": FORMATS["json lines"]}, "bench_list": {"file_name": FORMATS["json list"]}}))


def stage_yaml(folder: Path, tokenizer: str, workers: int, *, dataset: str = "bench") -> Path:
    import yaml

    path = folder / f"{dataset}.yaml"
    path.write_text(yaml.safe_dump({
        "model_name_or_path": tokenizer, "stage": "sft", "dataset": dataset, "dataset_dir": str(folder),
        "template": "qwen", "cutoff_len": 1024, "preprocessing_num_workers": workers,
    }))
    return path


def child(folder: Path, tokenizer: str, workers: int) -> None:
    """Run `tuneline data preprocess` in this process; print its rows and seconds as JSON."""
    import importlib

    from transformers import AutoTokenizer

    from tuneline.flows.single import preprocess

    # Module imports cost once per process, not per row, so they are not timed; transformers
    # imports lazily, so one load pulls in what tokenizer loading needs. The timed run loads the
    # tokenizer again, so its load is timed.
    importlib.import_module("pyarrow")
    AutoTokenizer.from_pretrained(tokenizer)
    config = stage_yaml(folder, tokenizer, workers)
    started = time.perf_counter()
    counters = preprocess(str(config), [], output=str(folder / "out"))
    seconds = time.perf_counter() - started
    print(json.dumps({"rows": counters["rows_in"], "seconds": seconds}))


def raw_ceiling(folder: Path, tokenizer_path: str) -> float:
    """rows/s of one batched `tokenizer(texts)` call on the rendered conversations."""
    from transformers import AutoTokenizer

    from tuneline.core.data.dataset_info import get_dataset_attrs, load_rows
    from tuneline.core.templates.conversation import fix_tokenizer, get_template, render_text

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
    template = get_template("qwen")
    fix_tokenizer(template, tokenizer)
    rows = load_rows(get_dataset_attrs(["bench"], folder)[0], folder)
    texts = [render_text(template, tokenizer, messages=[*r["prompt"], *r["response"]], system=r["system"] or None) for r in rows]
    # The ceiling at its best: without pauses of the cycle collector (preprocessing pauses it too).
    gc.collect()
    gc.disable()
    started = time.perf_counter()
    tokenizer(texts, add_special_tokens=False)
    seconds = time.perf_counter() - started
    gc.enable()
    return len(texts) / seconds


def command_peak_rss(folder: Path, tokenizer: str, workers: int, *, dataset: str) -> dict:
    """Run `tuneline data preprocess` under /usr/bin/time -v; its tree's peak RSS in MiB and wall seconds."""
    config = stage_yaml(folder, tokenizer, workers, dataset=dataset)
    output = folder / f"out-{dataset}"
    command = ["/usr/bin/time", "-v", sys.executable, "-m", "tuneline.flows.cli", "data", "preprocess", str(config),
               "--output", str(output)]
    started = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, **QUIET})
    descendants: dict[int, int] = {}
    command_pids: set[int] = set()
    stop = threading.Event()
    sampler = threading.Thread(target=_sample_descendants, args=(process.pid, descendants, command_pids, stop), daemon=True)
    sampler.start()
    stdout, stderr = process.communicate()
    stop.set()
    sampler.join()
    seconds = time.perf_counter() - started
    if process.returncode != 0:
        raise SystemExit(f"tuneline data preprocess failed ({process.returncode}):\n{stdout}\n{stderr}")
    own_kib = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", stderr).group(1))
    # time measures its child (the tuneline process) exactly; the processes below it come from the samples
    workers_kib = sum(kib for pid, kib in descendants.items() if pid not in command_pids)
    return {"peak_rss_mib": (own_kib + workers_kib) / 1024, "seconds": seconds, "processes": max(1, len(descendants))}


def _sample_descendants(root: int, peaks: dict[int, int], direct: set[int], stop: threading.Event) -> None:
    """Every process below `root`, by pid, with the last VmHWM (KiB) read while it lived; `root`'s own
    children also go into `direct`."""
    while not stop.is_set():
        for pid, parent in _tree(root):
            if parent == root:
                direct.add(pid)
            try:
                status = Path(f"/proc/{pid}/status").read_text()
            except OSError:
                continue
            found = re.search(r"^VmHWM:\s+(\d+) kB", status, re.MULTILINE)
            if found:
                peaks[pid] = max(peaks.get(pid, 0), int(found.group(1)))
        stop.wait(SAMPLE_SECONDS)


def _tree(root: int) -> list[tuple[int, int]]:
    """(pid, parent pid) of every process below `root`, from each thread's /proc children list."""
    found: list[tuple[int, int]] = []
    pending = [root]
    while pending:
        pid = pending.pop()
        for task in Path(f"/proc/{pid}/task").glob("*") if Path(f"/proc/{pid}/task").is_dir() else ():
            try:
                children = [int(c) for c in (task / "children").read_text().split()]
            except OSError:
                continue
            found += [(child, pid) for child in children]
            pending += children
    return found


def measure_memory(tokenizer: str, workers: int) -> dict[tuple[str, int], dict]:
    results = {}
    for rows in SIZES:
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp)
            write_dataset(folder, rows)
            for label, dataset in (("json list", "bench_list"), ("json lines", "bench")):
                results[label, rows] = command_peak_rss(folder, tokenizer, workers, dataset=dataset)
    return results


def memory_table(results: dict[tuple[str, int], dict]) -> str:
    small, large = SIZES
    lines = [f"{'format':<12} {'rows':>8} {'peak RSS':>10} {'wall':>8} {'rows/s':>8} {'processes':>9}"]
    for (label, rows), result in results.items():
        lines.append(f"{label:<12} {rows:>8,} {result['peak_rss_mib']:>6.0f} MiB {result['seconds']:>6.1f} s "
                     f"{rows / result['seconds']:>8.0f} {result['processes']:>9}")
    lines.append("")
    for label in FORMATS:
        ratio = results[label, large]["peak_rss_mib"] / results[label, small]["peak_rss_mib"]
        verdict = "ok" if ratio <= GOAL_RATIO else "over the goal"
        lines.append(f"peak RSS {large // 1000}k/{small // 1000}k, {label + ':':<12} {ratio:.2f}x  (goal <= {GOAL_RATIO}x: {verdict})")
    return "\n".join(lines)


def measure_speed(rows: int, tokenizer: str, workers: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        write_dataset(folder, rows)
        result = subprocess.run([sys.executable, __file__, "--child", str(folder), "--tokenizer", tokenizer,
                                 "--workers", str(workers)], capture_output=True, text=True, check=True)
        measured = json.loads(result.stdout.strip().splitlines()[-1])
        measured["raw_rows_per_s"] = raw_ceiling(folder, tokenizer)
        return measured


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokenizer", default=str(REPO_ROOT.parent / "shared/tokenizers/qwen2.5"))
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--memory-only", action="store_true", help="skip the throughput comparison")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(Path(args.child), args.tokenizer, args.workers)
        return
    print(f"tokenizer {args.tokenizer}, template qwen, cutoff_len 1024, workers {args.workers}")
    print(memory_table(measure_memory(args.tokenizer, args.workers)))
    if args.memory_only:
        return
    for rows in SIZES:
        result = measure_speed(rows, args.tokenizer, args.workers)
        ours = result["rows"] / result["seconds"]
        print(f"{rows:,} rows (json lines):")
        print(f"  tuneline data preprocess:      {ours:10.0f} rows/s ({result['seconds']:.2f} s, tokenizer loading included)")
        print(f"  raw tokenizer(texts) ceiling:  {result['raw_rows_per_s']:10.0f} rows/s")
        print(f"  ratio (tuneline / raw):        {ours / result['raw_rows_per_s']:10.2f}")


if __name__ == "__main__":
    main()
