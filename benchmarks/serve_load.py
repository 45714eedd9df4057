"""`tuneline api` under load and hostile input, against the same requests sent one at a time.

    python benchmarks/serve_load.py [--requests 200] [--clients 32] [--max-new-tokens 16] [--min-speedup 3]
                                    [--max-batch N] [--queue-size N] [--model DIR]

Builds the project's tiny LLaMA-shaped model in a temporary folder, serves it with `tuneline api`
(127.0.0.1, a free port, chatml, greedy with a repetition penalty) and sends REQUESTS requests from
CLIENTS concurrent clients: prompts of mixed lengths and turns, mixed `max_tokens` (some left to the
served default), some streamed, some of those closed after their first chunks, a few whose prompt
leaves less room in the context than they ask for, and hostile ones (a body over the size limit,
too many stop strings or messages, a prompt longer than the context, a text/plain body, a foreign
Host header; see serve_load_clients.py). A client that gets 503 waits its
`Retry-After` and asks again, as a client of a queue does. A probe asks for `/v1/models` every
200 ms throughout.

Checks: no 5xx but 503 and no broken connection; each hostile request answered with its 4xx; every
full answer (non-streamed, or streamed to its end, in both runs) equal to the greedy answer of the
same model loaded here with transformers on the prompt ids the server's renderer writes;
`/v1/models` always within 1 s; the server's RSS after the run within 10% of its RSS after a
warm-up round; the server idle (under half a CPU) in the second after the run, so no dropped
stream's generation went on; the full answers per second of the concurrent run (whose wall time
holds the other requests too) at least MIN_SPEEDUP times those of the same requests sent one at a
time to the same server. Prints the numbers, then PASS, or FAIL naming each failed check, and exits
1 on failure. The server takes the environment's OMP_NUM_THREADS; its API_* settings are left out.
"""

from __future__ import annotations

import os
import sys

# benchmarks/tokenize.py would shadow the standard library's `tokenize` while this folder leads the path,
# so the folder goes to its end (serve_load_clients is imported from it).
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != HERE] + [HERE]

import argparse
import dataclasses
import json
import re
import signal
import subprocess
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from serve_load_clients import ANSWERED, EXPECTED, Outcome, Probe, plan_requests, run_all

REPO_ROOT = Path(__file__).resolve().parent.parent
QUIET = {"HF_HUB_OFFLINE": "1", "DO_NOT_TRACK": "true", "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
         "MLFLOW_DISABLE_TELEMETRY": "true", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_DISABLE_PROGRESS_BARS": "1",
         "TRANSFORMERS_VERBOSITY": "error"}
MODEL = {"vocab_size": 1024, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
         "num_attention_heads": 2, "num_key_value_heads": 1}
REPETITION_PENALTY = 3.0  # the random tiny model would otherwise repeat one newline
URL_LINE = re.compile(r"^tuneline api: .* at (http://[^\s/]+)", re.M)
PROBE_LIMIT, RSS_GROWTH, IDLE_LIMIT = 1.0, 0.10, 0.5


class Reference:
    """The served model loaded here as the server loads it: prompts rendered by the same renderer, and
    transformers' greedy generate with the served generation settings."""

    def __init__(self, inference_yaml: Path) -> None:
        import torch

        from tuneline.core.inference.chat import chat_template, load_chat_model
        from tuneline.core.inference.prompts import PromptRenderer
        from tuneline.core.serving.sources import served_model

        torch.set_num_threads(1)
        served = served_model(str(inference_yaml))
        self.model, self.tokenizer = load_chat_model(served.source, template=served.template, keys=served.keys,
                                                     model_config=served.model_config)
        self.renderer = PromptRenderer(self.tokenizer, chat_template(served.template, self.tokenizer, keys=served.keys))
        self.generating = served.generating
        self.context = int(self.model.config.get_text_config().max_position_embeddings)
        self._answers: dict[tuple[tuple[int, ...], int], str] = {}

    def prompt_ids(self, messages: list[dict[str, str]], system: str | None) -> tuple[int, ...]:
        return tuple(self.renderer.prompt_ids(messages, system=system))

    def answer(self, key: tuple[tuple[int, ...], int]) -> str:
        """The greedy answer to prompt ids `key[0]` with max_new_tokens `key[1]`, computed once."""
        if key not in self._answers:
            import torch

            from tuneline.core.evaluation.predict import generation_kwargs

            prompt, max_new_tokens = key
            generating = dataclasses.replace(self.generating, max_new_tokens=max_new_tokens)
            ids = torch.tensor([prompt])
            with torch.no_grad():
                output = self.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                                             **generation_kwargs(generating, self.tokenizer, self.model))
            self._answers[key] = self.tokenizer.decode(output[0, len(prompt):],
                                                       skip_special_tokens=generating.skip_special_tokens)
        return self._answers[key]


# -- the server -------------------------------------------------------------------------------------

def build_model(folder: Path) -> Path:
    from tuneline.core.models.tiny.text import BaseModelConfig, build_base_model

    texts = [json.loads(line)["text"] for line in (REPO_ROOT / "data/demo_pretrain.jsonl").read_text().splitlines()]
    build_base_model(texts, folder / "base", config=BaseModelConfig(**MODEL))
    return folder / "base"


def write_inference_yaml(model: Path, folder: Path, *, max_new_tokens: int) -> Path:
    import yaml

    config = {"model_name_or_path": str(model), "template": "chatml", "infer_backend": "huggingface",
              "do_sample": False, "max_new_tokens": max_new_tokens, "repetition_penalty": REPETITION_PENALTY}
    path = folder / "inference.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def start_server(inference_yaml: Path, folder: Path, *, decoding: list[str]) -> tuple[subprocess.Popen, Path]:
    log = folder / "api.log"
    # the server's settings left at their defaults (no key, the limits the hostile requests exceed)
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("API_")}, **QUIET,
           "TUNELINE_CACHE": str(folder / "cache")}
    command = [sys.executable, "-m", "tuneline.flows.cli", "api", str(inference_yaml), "--host", "127.0.0.1", "--port", "0",
               *decoding]
    return subprocess.Popen(command, env=env, cwd=folder, stdout=log.open("w"), stderr=subprocess.STDOUT), log


def wait_for_url(process: subprocess.Popen, log: Path, *, timeout: float = 120) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = URL_LINE.search(log.read_text(errors="replace"))
        if found:
            return found.group(1)
        if process.poll() is not None:
            raise SystemExit(f"tuneline api exited with {process.returncode}:\n{log.read_text()[-3000:]}")
        time.sleep(0.1)
    raise SystemExit(f"tuneline api printed no URL within {timeout:.0f} s:\n{log.read_text()[-3000:]}")


def stop_server(process: subprocess.Popen) -> None:
    """The server stopped by its PID: SIGTERM, then SIGKILL if it has not ended within 10 s."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5)


def busy_share(pid: int, *, seconds: float = 1.0) -> float:
    """The CPU time the server spends over the next `seconds`, as a share of them: near 0 when idle, 1 or
    more while a generation nobody waits for goes on."""
    import psutil

    processes = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]  # the decoding process too
    before = sum(sum(process.cpu_times()[:2]) for process in processes)
    time.sleep(seconds)
    return (sum(sum(process.cpu_times()[:2]) for process in processes) - before) / seconds


def cpu_seconds(pid: int) -> dict[str, float]:
    """CPU seconds so far of the server's HTTP process, its decoding process and this process (the clients)."""
    import psutil

    server = psutil.Process(pid)
    used = lambda process: sum(process.cpu_times()[:2])  # noqa: E731
    return {"HTTP process": used(server), "decoding process": sum(used(child) for child in server.children(recursive=True)),
            "clients": used(psutil.Process())}


def rss_mib(pid: int) -> float:
    import psutil

    process = psutil.Process(pid)
    return sum(p.memory_info().rss for p in [process, *process.children(recursive=True)]) / 2**20


# -- the report -------------------------------------------------------------------------------------

def wrong_answers(outcomes: list[Outcome], reference: Reference) -> list[str]:
    """A line for each request not answered as it must be: its status, or its text against the reference."""
    wrong = []
    for number, outcome in enumerate(outcomes, 1):
        kind, final = outcome.planned.kind, outcome.statuses[-1]
        expected = EXPECTED.get(kind, 200)
        if final != expected:
            wrong.append(f"request {number} ({kind}): status {final}, expected {expected}"
                         + (f" ({outcome.problem})" if outcome.problem else ""))
        elif kind in ANSWERED and outcome.text != reference.answer(outcome.planned.reference):
            wrong.append(f"request {number} ({kind}): answered {outcome.text!r}, "
                         f"the greedy answer is {reference.answer(outcome.planned.reference)!r}")
    return wrong


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))] if ordered else float("nan")


def statuses_line(outcomes: list[Outcome]) -> str:
    counts = Counter(status for outcome in outcomes for status in outcome.statuses)
    return ", ".join(f"{status if status else 'broken'} x {count}" for status, count in sorted(counts.items()))


@dataclass(frozen=True)
class Measured:
    outcomes: list[Outcome]
    wall: float
    sequential: list[Outcome]
    """The full answers of the concurrent run sent again, one at a time."""
    sequential_wall: float
    probe_latencies: list[float]
    rss_warm: float
    rss_after: float
    rss_sequential: float
    busy_after: float
    cpu: dict[str, float]
    """CPU seconds each process spent during the concurrent run."""
    """The server's CPU share in the second after the concurrent run (dropped streams must not go on)."""
    log: Path
    """The server's output (read before the temporary folder goes)."""


def measure(args: argparse.Namespace, folder: Path) -> tuple[Measured, Reference]:
    """The warm-up round, the concurrent run and the sequential one against a server started here and
    always stopped, and the reference the answers are checked against."""
    model = args.model or build_model(folder)
    inference_yaml = write_inference_yaml(model, folder, max_new_tokens=args.max_new_tokens)
    decoding = [*(["--max-batch", str(args.max_batch)] if args.max_batch else []),
                *(["--queue-size", str(args.queue_size)] if args.queue_size else [])]
    process, log = start_server(inference_yaml, folder, decoding=decoding)
    try:
        reference = Reference(inference_yaml)  # loads while the server loads its copy
        lines = (REPO_ROOT / "data/demo_pretrain.jsonl").read_text().splitlines()[:200]
        options = {"words": " ".join(json.loads(line)["text"] for line in lines).split(),
                   "default_max_tokens": args.max_new_tokens}
        warm_plan = plan_requests(args.clients, reference, seed=args.seed + 1, **options)
        plan = plan_requests(args.requests, reference, seed=args.seed, **options)
        for planned in [*warm_plan, *plan]:
            if planned.reference is not None:
                reference.answer(planned.reference)
        url = wait_for_url(process, log)
        shape = reference.model.config.get_text_config()
        print(f"tuneline api on {'the tiny LLaMA-shaped model' if args.model is None else args.model} (hidden "
              f"{shape.hidden_size}, {shape.num_hidden_layers} layers, context {reference.context}), chatml, greedy, "
              f"repetition_penalty {REPETITION_PENALTY}, "
              f"max_new_tokens {args.max_new_tokens}; {os.cpu_count()} CPUs; server {url} (pid {process.pid}"
              f"{', ' + ' '.join(decoding) if decoding else ''})")
        print(f"plan: {args.requests} requests from {args.clients} clients: "
              + ", ".join(f"{kind} {count}" for kind, count in Counter(p.kind for p in plan).most_common()))
        warm_outcomes, warm_wall = run_all(url, warm_plan, clients=args.clients)
        rss_warm = rss_mib(process.pid)
        print(f"warm-up: {len(warm_plan)} requests in {warm_wall:.1f} s ({statuses_line(warm_outcomes)})")
        probe = Probe(url)
        probe.start()
        before = cpu_seconds(process.pid)
        try:
            outcomes, wall = run_all(url, plan, clients=args.clients)
        finally:
            probe.stopped.set()
            probe.join()
        cpu = {role: seconds - before[role] for role, seconds in cpu_seconds(process.pid).items()}
        rss_after, busy_after = rss_mib(process.pid), busy_share(process.pid)
        sequential, sequential_wall = run_all(url, [o.planned for o in full_answers(outcomes)], clients=1)
        return Measured(outcomes, wall, sequential, sequential_wall, probe.latencies, rss_warm, rss_after,
                        rss_mib(process.pid), busy_after, cpu, log), reference
    finally:
        stop_server(process)


def full_answers(outcomes: list[Outcome]) -> list[Outcome]:
    return [o for o in outcomes if o.planned.kind in ANSWERED and o.statuses[-1] == 200]


def report(measured: Measured, reference: Reference, *, min_speedup: float) -> list[str]:
    """Prints what was measured; the checks that failed."""
    m = measured
    answered = full_answers(m.outcomes)
    wrong, wrong_sequential = wrong_answers(m.outcomes, reference), wrong_answers(m.sequential, reference)
    unexpected_5xx = sum(1 for o in m.outcomes for s in o.statuses if s >= 500 and s != 503)
    broken = sum(1 for o in m.outcomes for s in o.statuses if s == 0)
    equal = sum(1 for o in answered if o.text == reference.answer(o.planned.reference))
    rate = len(answered) / m.wall
    sequential_rate = len(m.sequential) / m.sequential_wall if m.sequential else float("nan")
    ratio, growth = rate / sequential_rate, m.rss_after / m.rss_warm - 1
    probe_max = max(m.probe_latencies, default=float("inf"))
    latencies = [o.seconds for o in answered]

    print(f"concurrent: {len(m.outcomes)} requests in {m.wall:.1f} s")
    print(f"  statuses: {statuses_line(m.outcomes)}")
    print(f"  latency of full answers: p50 {percentile(latencies, 0.5):.2f} s, p99 {percentile(latencies, 0.99):.2f} s")
    print(f"  answers equal to the greedy reference: {equal}/{len(answered)}")
    print(f"  /v1/models: {len(m.probe_latencies)} probes, max {probe_max:.3f} s (goal < {PROBE_LIMIT:.0f} s)")
    print("  CPU seconds in it: " + ", ".join(f"{role} {seconds:.2f}" for role, seconds in m.cpu.items())
          + f" (of {m.wall * (os.cpu_count() or 1):.2f} on {os.cpu_count()} cores)")
    print(f"  server CPU in the second after the run: {m.busy_after:.0%} (goal < {IDLE_LIMIT:.0%}: dropped streams "
          "generate no more)")
    print(f"sequential: the {len(m.sequential)} full answers again, one at a time, in {m.sequential_wall:.1f} s "
          f"(statuses: {statuses_line(m.sequential)}; p50 {percentile([o.seconds for o in m.sequential], 0.5):.2f} s)")
    print(f"throughput of the full answers: concurrent {rate:.2f} requests/s, sequential {sequential_rate:.2f} "
          f"requests/s, ratio {ratio:.2f} (goal >= {min_speedup:g})")
    print(f"server RSS: {m.rss_warm:.1f} MiB after warm-up, {m.rss_after:.1f} MiB after the run ({growth:+.1%}, goal "
          f"within {RSS_GROWTH:.0%}), {m.rss_sequential:.1f} MiB after the sequential run")
    for line in (wrong + [f"sequential {line}" for line in wrong_sequential])[:10]:
        print(f"  wrong: {line}")
    if unexpected_5xx or broken:
        print("the server's log ends:\n" + "\n".join(m.log.read_text(errors="replace").splitlines()[-40:]))

    checks = {f"no 5xx but 503 ({unexpected_5xx} seen)": unexpected_5xx == 0,
              f"no broken connection or stream ({broken} seen)": broken == 0,
              f"every request answered as expected ({len(wrong)} not)": not wrong,
              f"the sequential answers too ({len(wrong_sequential)} not)": not wrong_sequential,
              f"some full answers ({len(answered)})": bool(answered),
              f"/v1/models within {PROBE_LIMIT:.0f} s ({probe_max:.3f} s)": probe_max < PROBE_LIMIT,
              f"RSS within {RSS_GROWTH:.0%} ({growth:+.1%})": abs(growth) <= RSS_GROWTH,
              f"server idle after the run ({m.busy_after:.0%} CPU)": m.busy_after < IDLE_LIMIT,
              f"speedup >= {min_speedup:g} ({ratio:.2f})": ratio >= min_speedup}
    return [name for name, passed in checks.items() if not passed]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--max-new-tokens", type=int, default=16, help="the served default of max_new_tokens")
    parser.add_argument("--min-speedup", type=float, default=3.0,
                        help="the least ratio of concurrent to sequential answers per second that passes")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-batch", type=int, help="the server's --max-batch (default: its own)")
    parser.add_argument("--queue-size", type=int, help="the server's --queue-size (default: its own); a small one "
                        "makes clients meet 503s")
    parser.add_argument("--model", type=Path, help="serve this model folder (its tokenizer beside it) instead of "
                        "building the tiny one; it is loaded here too, for the reference answers")
    args = parser.parse_args()
    os.environ.update(QUIET)
    # a SIGTERM ends the run through the finally blocks, which stop the server
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with tempfile.TemporaryDirectory(prefix="serve_load-") as tmp:
        failed = report(*measure(args, Path(tmp)), min_speedup=args.min_speedup)
    print("PASS" if not failed else f"FAIL: {'; '.join(failed)}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
