"""A tool call through the served API end to end: the tiny base taught one call in the qwen template's
tool format (a hundred steps on one conversation, encoded as training encodes it), served by the app
(FastAPI's test client), answers a request that offers the tool with `tool_calls`, as OpenAI's API does."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import train_steps

TOOL = {"name": "add", "description": "Add two numbers.",
        "parameters": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}}}
CALL = {"name": "add", "arguments": {"a": 2, "b": 3}}
QUESTION = "What is 2 plus 3?"


@pytest.fixture(scope="module")
def taught(tiny_base: Path, tmp_path_factory) -> Path:
    """The tiny base after learning to answer QUESTION, with TOOL offered, by calling it."""
    import torch

    from tuneline.core.models.loading import load_model, load_tokenizer
    from tuneline.core.templates.conversation import Conversation, encode_turns, fix_tokenizer, get_template

    tokenizer = load_tokenizer(tiny_base)
    template = get_template("qwen", tokenizer=tokenizer)
    fix_tokenizer(template, tokenizer)
    conversation = Conversation(prompt=[{"role": "user", "content": QUESTION}],
                                response=[{"role": "function", "content": json.dumps([CALL])}], tools=json.dumps([TOOL]))
    (prompt, reply), = encode_turns(template, tokenizer, conversation)
    model = load_model(tiny_base, vocab_size=len(tokenizer))
    ids = torch.tensor([prompt + reply])
    labels = torch.tensor([[-100] * len(prompt) + reply])
    torch.manual_seed(0)
    losses, _ = train_steps(model, {"input_ids": ids, "labels": labels}, steps=100, learning_rate=3e-3)
    assert losses[-1] < 0.05, losses[-5:]
    folder = tmp_path_factory.mktemp("taught")
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def client(taught: Path):
    from fastapi.testclient import TestClient

    from tuneline.core.config import GeneratingConfig
    from tuneline.core.inference.chat import ModelSource
    from tuneline.core.serving.app import create_app
    from tuneline.core.serving.engine import load_engine
    from tuneline.core.serving.sources import ServedModel

    served = ServedModel(ModelSource(str(taught), None, str(taught)), name="taught", template="qwen",
                         generating=GeneratingConfig(max_new_tokens=64, do_sample=False))
    with TestClient(create_app(load_engine(served), model_name="taught", api_key=None)) as client:
        yield client


def test_an_answer_in_the_tool_format_comes_back_as_tool_calls(client):
    body = {"model": "taught", "messages": [{"role": "user", "content": QUESTION}], "temperature": 0,
            "tools": [{"type": "function", "function": TOOL}]}
    choice = client.post("/v1/chat/completions", json=body).json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls", choice
    message = choice["message"]
    assert message["content"] is None and len(message["tool_calls"]) == 1
    call = message["tool_calls"][0]
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"]["name"] == "add" and json.loads(call["function"]["arguments"]) == CALL["arguments"]
