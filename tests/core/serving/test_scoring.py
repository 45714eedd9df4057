"""A reward model served: LLaMA-Factory's `POST /v1/score/evaluation` on the app itself (FastAPI's
test client, a real tiny reward model), its scores against the scoring head read by hand, one text
at a time; chat completions refused with 405, and the reward models `tuneline api` recognises."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tuneline.core.config import ModelConfig
from tuneline.core.inference.chat import ModelSource
from tuneline.core.serving.scoring import is_reward_model, load_scoring_engine

TEXTS = ["the cat sat on the mat", "two and two make four, and four and four make eight", "yes"]


@pytest.fixture(scope="module")
def reward_folder(tiny_base: Path, tmp_path_factory) -> Path:
    """The tiny base with a fresh one-output scoring head, saved as full weights (an rm stage's full output)."""
    import torch
    from transformers import AutoTokenizer

    from tuneline.core.models.loading import load_model

    folder = tmp_path_factory.mktemp("reward")
    torch.manual_seed(0)
    load_model(tiny_base, head="score").save_pretrained(folder)
    AutoTokenizer.from_pretrained(tiny_base).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def client(reward_folder: Path):
    from fastapi.testclient import TestClient

    from tuneline.core.serving.app import create_app

    engine = load_scoring_engine(ModelSource(str(reward_folder), None, str(reward_folder)), model_config=ModelConfig())
    with TestClient(create_app(None, model_name="rm", api_key=None, scorer=engine)) as client:
        yield client


def by_hand(folder: Path, text: str, *, limit: int | None = None) -> float:
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    ids = AutoTokenizer.from_pretrained(folder).encode(text, add_special_tokens=False)[:limit]
    model = AutoModelForSequenceClassification.from_pretrained(folder).eval()
    with torch.no_grad():
        return float(model(input_ids=torch.tensor([ids])).logits[0, 0])


def test_each_text_gets_the_score_its_last_token_reads_alone(client, reward_folder: Path):
    response = client.post("/v1/score/evaluation", json={"model": "rm", "messages": TEXTS})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["model"] == "rm" and body["id"].startswith("scoreeval-")
    expected = [by_hand(reward_folder, text) for text in TEXTS]  # unpadded, one at a time
    assert body["scores"] == pytest.approx(expected, abs=1e-5)
    assert len(set(body["scores"])) == 3
    cut = client.post("/v1/score/evaluation", json={"messages": TEXTS[1:2], "max_length": 4}).json()["scores"]
    assert cut == pytest.approx([by_hand(reward_folder, TEXTS[1], limit=4)], abs=1e-5)
    assert cut != pytest.approx(body["scores"][1:2], abs=1e-5)


@pytest.mark.parametrize(("body", "status", "message"), [
    ({"messages": [{"role": "user", "content": "Hi"}]}, 405, "Not allowed: this server serves a reward model"),
    ({"messages": []}, 400, "'messages' must be a non-empty list of non-empty strings"),
    ({"messages": ["a"], "max_length": 0}, 400, "'max_length' must be a positive whole number, got 0."),
    ({"messages": ["a"], "max_length": 10**9}, 400, "'max_length' is 1000000000, above the reward model's context of "),
])
def test_what_a_reward_model_does_not_answer(client, body: dict, status: int, message: str):
    path = "/v1/chat/completions" if status == 405 else "/v1/score/evaluation"
    response = client.post(path, json=body)
    assert response.status_code == status and message in response.json()["error"]["message"], response.text


def test_reward_models_are_recognised_by_their_head_or_adapter_task(reward_folder: Path, tiny_base: Path, tmp_path: Path):
    assert is_reward_model(ModelSource(str(reward_folder), None, str(reward_folder)))
    assert not is_reward_model(ModelSource(str(tiny_base), None, str(tiny_base)))
    for task, expected in (("SEQ_CLS", True), ("CAUSAL_LM", False)):
        adapter = tmp_path / task
        adapter.mkdir()
        (adapter / "adapter_config.json").write_text(json.dumps({"task_type": task, "base_model_name_or_path": str(tiny_base)}))
        assert is_reward_model(ModelSource(str(tiny_base), adapter, str(tiny_base))) is expected
