"""`tuneline api` / `tuneline webchat` started as a real subprocess for a test module, and the
greedy settings both the server and the tests' own generate() use."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from conftest import free_port, start_process, stop_process

MAX_NEW_TOKENS = 8
REPETITION_PENALTY = 3.0  # the random tiny model would otherwise repeat one newline
URL_LINE = re.compile(r"^tuneline (?:api|webchat): .* at (http://[^\s/]+)", re.M)


@dataclass(frozen=True)
class RunningServer:
    process: subprocess.Popen
    url: str
    """http://127.0.0.1:PORT, without /v1."""
    log: Path


def inference_yaml(tiny_base: Path, folder: Path, *, max_new_tokens: int = MAX_NEW_TOKENS) -> Path:
    """A LLaMA-Factory inference YAML for the tiny base: chatml, greedy, its generation keys the server's defaults."""
    config = {"model_name_or_path": str(tiny_base), "template": "chatml", "infer_backend": "huggingface",
              "do_sample": False, "max_new_tokens": max_new_tokens, "repetition_penalty": REPETITION_PENALTY}
    path = folder / "inference.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@dataclass(frozen=True)
class StartingServer:
    """A server process that is loading its model; `wait()` returns it once it accepts requests."""

    process: subprocess.Popen
    log: Path
    command: str

    def wait(self, timeout: float = 90) -> RunningServer:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = URL_LINE.search(self.log.read_text(errors="replace")) if self.log.is_file() else None
            if found:
                return RunningServer(self.process, found.group(1), self.log)
            if self.process.poll() is not None:
                raise AssertionError(f"tuneline {self.command} exited with {self.process.returncode}:\n"
                                     f"{self.log.read_text()[-3000:]}")
            time.sleep(0.1)
        stop_process(self.process)
        raise AssertionError(f"tuneline {self.command} printed no URL in {timeout} s:\n{self.log.read_text()[-3000:]}")


def start_server(command: str, target: str, *, folder: Path, env: dict[str, str] | None = None) -> StartingServer:
    """`tuneline COMMAND TARGET --port P` started in `folder` (the test can load its own model meanwhile)."""
    log = folder / f"{command}.log"
    environment = {**os.environ, "OMP_NUM_THREADS": "1", "TUNELINE_CACHE": str(folder / "cache"), **(env or {})}
    process = start_process([sys.executable, "-m", "tuneline.flows.cli", command, target, "--port", str(free_port())],
                            environment, log, cwd=folder)
    return StartingServer(process, log, command)


def exported_greedy(folder: Path, messages: list[dict], *, template: str, max_new_tokens: int) -> tuple[list[int], str]:
    """The model in `folder`'s own greedy generate() on the prompt ids training's template encoder
    writes for `messages`: (prompt ids, decoded answer). What a served export must answer."""
    import torch

    from tuneline.core.models.loading import load_model, load_tokenizer
    from tuneline.core.templates.conversation import Conversation, encode_prompt, fix_tokenizer, get_template

    tokenizer = load_tokenizer(folder)
    chat_template = get_template(template, tokenizer=tokenizer)
    fix_tokenizer(chat_template, tokenizer)
    prompt = encode_prompt(chat_template, tokenizer, Conversation(messages))
    model = load_model(folder).eval()
    with torch.no_grad():
        output = model.generate(input_ids=torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                                max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    return prompt, tokenizer.decode(output[0, len(prompt):], skip_special_tokens=True)


def greedy_reference(tiny_base: Path):
    """`answer(messages, system, tools=None)`: the tiny base's own greedy generate() on the prompt ids that
    tuneline's training encoder writes for the conversation (the supervised encoder, the reply left out):
    (prompt ids, generated ids, decoded text)."""
    import torch

    from tuneline.core.config import GeneratingConfig
    from tuneline.core.evaluation.predict import generation_kwargs
    from tuneline.core.models.loading import load_model, load_tokenizer
    from tuneline.core.templates.conversation import Conversation, encode_turns, fix_tokenizer, get_template

    tokenizer = load_tokenizer(tiny_base)
    template = get_template("chatml", tokenizer=tokenizer)
    fix_tokenizer(template, tokenizer)
    model = load_model(tiny_base, vocab_size=len(tokenizer)).eval()
    kwargs = generation_kwargs(GeneratingConfig(max_new_tokens=MAX_NEW_TOKENS, do_sample=False,
                                                repetition_penalty=REPETITION_PENALTY), tokenizer, model)

    def answer(messages: list[dict], system: str | None, tools: str | None = None) -> tuple[list[int], list[int], str]:
        conversation = Conversation(prompt=messages, response=[{"role": "assistant", "content": "4"}], system=system,
                                    tools=tools)
        turns = encode_turns(template, tokenizer, conversation)
        prompt = [token for source, target in turns[:-1] for token in source + target] + turns[-1][0]
        ids = torch.tensor([prompt])
        with torch.no_grad():
            output = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), **kwargs)
        new = output[0, len(prompt):].tolist()
        return prompt, new, tokenizer.decode(new, skip_special_tokens=True)

    return answer
