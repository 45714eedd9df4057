"""Tokenization throughput and memory of `tuneline data preprocess`, against the raw tokenizer.

    python benchmarks/tokenize.py [--tokenizer ../shared/tokenizers/qwen2.5] [--workers 1]

On generated alpaca datasets of 20,000 and 200,000 rows with the qwen template and cutoff_len
1024 it prints, for each size: rows/s of `tuneline data preprocess` (reading, rendering, encoding,
labels, Arrow output and the tokenizer's loading, in a fresh child process whose module imports
are done before the clock starts); rows/s of the raw `tokenizer(texts)` call on the same rendered
text, which is the ceiling since preprocessing must at least encode that text; their ratio. Then
the peak RSS of the preprocess process at both sizes.
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
import resource
import subprocess
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
WORDS = ("model data train token answer question river mountain city green blue quick slow small large "
         "bright dark early late north south water fire light sound number letter story").split()


def write_dataset(folder: Path, rows: int, *, seed: int = 0) -> None:
    draw = random.Random(seed)
    sentence = lambda n: " ".join(draw.choice(WORDS) for _ in range(n)).capitalize() + "."  # noqa: E731
    with (folder / "bench.jsonl").open("w", encoding="utf-8") as handle:
        for _ in range(rows):
            row = {"instruction": sentence(draw.randint(8, 40)), "input": sentence(draw.randint(0, 20)) if draw.random() < 0.3 else "",
                   "output": " ".join(sentence(draw.randint(5, 25)) for _ in range(draw.randint(1, 6)))}
            handle.write(json.dumps(row) + "\n")
    (folder / "dataset_info.json").write_text(json.dumps({"bench": {"file_name": "bench.jsonl"}}))


def stage_yaml(folder: Path, tokenizer: str, workers: int) -> Path:
    import yaml

    path = folder / "stage.yaml"
    path.write_text(yaml.safe_dump({
        "model_name_or_path": tokenizer, "stage": "sft", "dataset": "bench", "dataset_dir": str(folder),
        "template": "qwen", "cutoff_len": 1024, "preprocessing_num_workers": workers,
    }))
    return path


def child(folder: Path, tokenizer: str, workers: int) -> None:
    """Run `tuneline data preprocess` in this process; print rows/s and peak RSS as JSON."""
    import pyarrow  # noqa: F401
    from transformers import AutoTokenizer

    from tuneline.flows.single import preprocess

    # Module imports cost once per process, not per row, so they are not timed; transformers
    # imports lazily, so one load pulls in what tokenizer loading needs. The timed run loads the
    # tokenizer again, so its load is timed.
    AutoTokenizer.from_pretrained(tokenizer)
    config = stage_yaml(folder, tokenizer, workers)
    started = time.perf_counter()
    counters = preprocess(str(config), [], output=str(folder / "out"))
    seconds = time.perf_counter() - started
    print(json.dumps({"rows": counters["rows_in"], "seconds": seconds, "peak_rss_mib": peak_rss_kib() / 1024}))


def peak_rss_kib() -> int:
    """This process's peak RSS. Linux's VmHWM starts afresh at exec; ru_maxrss does not, so it
    would report the benchmark parent's size at the moment it forked this child."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


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


def measure(rows: int, tokenizer: str, workers: int) -> dict:
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
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(Path(args.child), args.tokenizer, args.workers)
        return
    small = measure(20_000, args.tokenizer, args.workers)
    large = measure(200_000, args.tokenizer, args.workers)
    print(f"tokenizer {args.tokenizer}, template qwen, cutoff_len 1024, workers {args.workers}")
    for label, result in (("20,000", small), ("200,000", large)):
        ours = result["rows"] / result["seconds"]
        print(f"{label} rows:")
        print(f"  tuneline data preprocess:      {ours:10.0f} rows/s ({result['seconds']:.2f} s, tokenizer loading included)")
        print(f"  raw tokenizer(texts) ceiling:  {result['raw_rows_per_s']:10.0f} rows/s")
        print(f"  ratio (tuneline / raw):        {ours / result['raw_rows_per_s']:10.2f}")
    print(f"peak RSS at  20,000 rows:        {small['peak_rss_mib']:10.0f} MiB")
    print(f"peak RSS at 200,000 rows:        {large['peak_rss_mib']:10.0f} MiB  ({large['peak_rss_mib'] / small['peak_rss_mib']:.2f}x)")

if __name__ == "__main__":
    main()
