"""The profiler keys: torch.profiler traces of chosen steps, and per-module forward/backward times.

`enable_torch_profiler` runs torch.profiler with LLaMA-Factory's schedule: each cycle skips
`profiler_wait_steps` steps, warms up for `profiler_warmup_steps` and records
`profiler_active_steps`, `profiler_repeat` cycles (0: until training ends), with
`profiler_record_shapes`, `profiler_profile_memory` and `profiler_with_stack`. Each recorded cycle
becomes a Chrome trace, `<profiler_output_dir>/rank_<N>/<host>_<pid>.<ns>.pt.trace.json` (the
names TensorBoard's profiler plugin reads; `profiler_output_dir` defaults to
`<output_dir>/profiler`), written under a temporary name and renamed when complete. At the end
of training the traces go to the stage's MLflow run as artifacts under `profiler/`.

`profile_modules` (comma-separated fnmatch patterns of module names, such as
`model.layers.*.mlp`) times the forward and backward passes of the modules it matches and prints
their means at each logging step, as LLaMA-Factory does. It times with CUDA events on a GPU and
with the wall clock on the CPU, where each operation ends before the next starts; LLaMA-Factory
turns it off without an accelerator.
"""

from __future__ import annotations

import fnmatch
import os
import socket
import time
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from transformers import TrainerCallback

from tuneline.core.config import RuntimeConfig
from tuneline.core.tracking import runs as tracking

if TYPE_CHECKING:
    from transformers import TrainerControl, TrainerState, TrainingArguments

TRACE_SUFFIX = ".pt.trace.json"
PROFILER_DIR = "profiler"  # under output_dir by default, and the runs' artifact folder


def profiler_callbacks(runtime: RuntimeConfig, *, output_dir: str, tracking_uri: str | None,
                       run_id: str | None) -> list[TrainerCallback]:
    """The callbacks the profiler keys ask for (none by default)."""
    callbacks: list[TrainerCallback] = []
    if runtime.enable_torch_profiler:
        trace_root = Path(runtime.profiler_output_dir or Path(output_dir) / PROFILER_DIR)
        callbacks.append(TorchProfilerCallback(runtime, trace_root=trace_root, tracking_uri=tracking_uri, run_id=run_id))
    if runtime.profile_modules:
        callbacks.append(ModuleTimerCallback(runtime.profile_modules))
    return callbacks


def write_trace_atomically(profile: Any, folder: Path) -> Path:
    """Export `profile`'s Chrome trace into `folder` under a temporary name, then rename it."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{socket.gethostname()}_{os.getpid()}.{time.time_ns()}{TRACE_SUFFIX}"
    partial = path.with_name(f".{path.name}.partial")
    profile.export_chrome_trace(str(partial))
    os.replace(partial, path)
    return path


class TorchProfilerCallback(TrainerCallback):
    """torch.profiler around the training steps; its traces go to `trace_root/rank_<N>` and MLflow."""

    def __init__(self, runtime: RuntimeConfig, *, trace_root: Path, tracking_uri: str | None, run_id: str | None) -> None:
        self.runtime, self.trace_root = runtime, trace_root
        self.tracking_uri, self.run_id = tracking_uri, run_id
        self.profile: Any = None
        self.folder = trace_root

    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs) -> None:
        import torch

        self.folder = self.trace_root / f"rank_{args.process_index}"
        activities = [torch.profiler.ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        runtime = self.runtime
        self.profile = torch.profiler.profile(
            activities=activities,
            schedule=torch.profiler.schedule(wait=runtime.profiler_wait_steps, warmup=runtime.profiler_warmup_steps,
                                             active=runtime.profiler_active_steps, repeat=runtime.profiler_repeat),
            on_trace_ready=lambda profile: write_trace_atomically(profile, self.folder),
            record_shapes=runtime.profiler_record_shapes,
            profile_memory=runtime.profiler_profile_memory,
            with_stack=runtime.profiler_with_stack,
        )
        self.profile.start()
        if state.is_world_process_zero:
            print(f"torch profiler: wait {runtime.profiler_wait_steps}, warmup {runtime.profiler_warmup_steps}, active "
                  f"{runtime.profiler_active_steps}, repeat {runtime.profiler_repeat}; traces in {self.trace_root}", flush=True)

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs) -> None:
        if self.profile is not None:
            self.profile.step()

    def on_train_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs) -> None:
        if self.profile is None:
            return
        self.profile.stop()
        self.profile = None
        traces = sorted(self.folder.glob(f"*{TRACE_SUFFIX}"))
        if self.tracking_uri and self.run_id and state.is_world_process_zero:  # rank 0 alone logs to MLflow
            for trace in traces:
                tracking.log_artifact(self.tracking_uri, self.run_id, trace, artifact_path=f"{PROFILER_DIR}/{self.folder.name}")
        if state.is_world_process_zero:
            print(f"torch profiler: {len(traces)} trace(s) written to {self.folder}", flush=True)


class ModuleTimerCallback(TrainerCallback):
    """Forward and backward milliseconds of the modules `patterns` match, printed at each logging step."""

    def __init__(self, patterns: str) -> None:
        self.patterns = [pattern.strip() for pattern in patterns.split(",") if pattern.strip()]
        self.handles: list[Any] = []
        self.started: dict[tuple[str, str], Any] = {}
        self.times: dict[tuple[str, str], list[float]] = defaultdict(list)
        self.recorded: list[tuple[tuple[str, str], Any, Any]] = []  # CUDA events of the calls of this step
        self.cuda = False

    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, model=None,
                       **kwargs) -> None:
        import torch

        self.cuda = torch.cuda.is_available() and args.device.type == "cuda"
        matched = [(name, module) for name, module in model.named_modules()
                   if name and any(fnmatch.fnmatch(name, pattern) for pattern in self.patterns)]
        for name, module in matched:
            self.handles += [module.register_forward_pre_hook(lambda *_, n=name: self._start(n, "fwd")),
                             module.register_forward_hook(lambda *_, n=name: self._stop(n, "fwd")),
                             module.register_full_backward_pre_hook(lambda *_, n=name: self._start(n, "bwd")),
                             module.register_full_backward_hook(lambda *_, n=name: self._stop(n, "bwd"))]
        if state.is_world_process_zero:
            found = f"{len(matched)} module(s), such as {matched[0][0]}" if matched else "no module"
            print(f"profile_modules: {', '.join(self.patterns)} match {found}", flush=True)

    def _start(self, name: str, phase: str) -> None:
        if self.cuda:
            import torch

            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            self.started[name, phase] = (start, end)
        else:
            self.started[name, phase] = time.perf_counter()

    def _stop(self, name: str, phase: str) -> None:
        started = self.started.get((name, phase))
        if started is None:
            return
        del self.started[name, phase]
        if self.cuda:
            started[1].record()
            self.recorded.append(((name, phase), *started))  # every call's pair, read at the step's end
            return
        self.times[name, phase].append(1000 * (time.perf_counter() - started))

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs) -> None:
        if not self.cuda:
            return
        import torch

        torch.cuda.synchronize()
        for key, start, end in self.recorded:
            self.times[key].append(start.elapsed_time(end))
        self.recorded.clear()

    def on_log(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs) -> None:
        if not self.times or not state.is_world_process_zero:
            self.times.clear()
            return
        lines = ["module times (ms, mean per call since the last log):"]
        for name in sorted({name for name, _ in self.times}):
            forward, backward = (_mean(self.times.get((name, phase), [])) for phase in ("fwd", "bwd"))
            lines.append(f"  {name}: forward {forward:.3f}, backward {backward:.3f}, total {forward + backward:.3f}")
        print("\n".join(lines), flush=True)
        self.times.clear()

    def on_train_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles.clear()


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0
