"""The export's train/serve parity gate: no difference reported where the exported chat template
renders as training does, the first differing token named where it does not, and a merged model
whose answers drift from base + adapter caught."""

from __future__ import annotations

import copy

import pytest

from tuneline.core.evaluation.export_parity import (
    Probe,
    RenderingCheck,
    answers_problem,
    check_rendering,
    probe_conversations,
)
from tuneline.core.templates.check import PROBE, PROBE_SYSTEM
from tuneline.core.templates.conversation import Conversation, chat_template_jinja, encode_prompt, fix_tokenizer, get_template

MULTI_TURN = Probe("a three-turn chat", Conversation(
    prompt=[{"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "Blue."},
            {"role": "user", "content": "Another?"}, {"role": "assistant", "content": "Green."},
            {"role": "user", "content": "And one more, please."}],
    response=[{"role": "assistant", "content": "Red, the colour of ripe tomatoes."}], system="Answer in one word."))


def _prepared(load, template_name: str, tokenizer_name: str):
    """The tokenizer as training prepares it: the template fixed onto it, its chat template written from it
    (a copy; the tests that break its chat template put the written one back)."""
    tokenizer = copy.deepcopy(load(tokenizer_name))
    template = get_template(template_name, tokenizer=tokenizer)
    fix_tokenizer(template, tokenizer)
    tokenizer.chat_template = chat_template_jinja(template, tokenizer)
    return template, tokenizer


@pytest.fixture(scope="module")
def prepared(load):
    """`prepared(template, tokenizer)`, each prepared once for the module (a deep copy takes a second or two)."""
    made = {}

    def get(template_name: str, tokenizer_name: str):
        if (template_name, tokenizer_name) not in made:
            made[template_name, tokenizer_name] = _prepared(load, template_name, tokenizer_name)
        template, tokenizer = made[template_name, tokenizer_name]
        return template, tokenizer

    return get


@pytest.mark.parametrize(("template_name", "tokenizer_name"), [
    ("qwen", "qwen2.5"), ("llama3", "llama3"), ("mistral", "mistral-v0.3"),
])
def test_the_chat_template_training_writes_passes(prepared, template_name, tokenizer_name):
    template, tokenizer = prepared(template_name, tokenizer_name)
    probes = [*probe_conversations(None), MULTI_TURN]
    assert check_rendering(tokenizer, template=template, trained=tokenizer, probes=probes) == RenderingCheck()


@pytest.mark.parametrize("template_name", ["llama2"])
def test_sentencepiece_segmentation_of_separately_encoded_messages_is_a_warning(prepared, template_name):
    """Training encodes each message apart (LLaMA-Factory's rule); one string segments otherwise around a
    message's first word, with the same text: recorded, not a failure."""
    template, tokenizer = prepared(template_name, "llama2")
    check = check_rendering(tokenizer, template=template, trained=tokenizer, probes=[MULTI_TURN])
    assert check.problem is None
    assert check.warning is not None and "writes the text training wrote" in check.warning


def test_a_changed_chat_template_is_reported_at_its_first_differing_token(prepared):
    """The training encoder never reads the chat template, so one tokenizer with a broken one plays both sides."""
    template, tokenizer = prepared("qwen", "qwen2.5")
    written = tokenizer.chat_template
    tokenizer.chat_template = written.replace("<|im_start|>assistant\\n", "<|im_start|>assistant ")
    assert tokenizer.chat_template != written
    one_turn = Probe("a one-turn chat", Conversation(PROBE[:1], PROBE[1:2], system=PROBE_SYSTEM))
    try:
        problem = check_rendering(tokenizer, template=template, trained=tokenizer, probes=[one_turn]).problem
    finally:
        tokenizer.chat_template = written
    prompt = encode_prompt(template, tokenizer, Conversation(PROBE[:1], system=PROBE_SYSTEM))
    assert problem is not None
    assert "writes other text than training for the prompt with the generation prefix of a one-turn chat" in problem
    assert f"first differ at token {len(prompt) - 1} " in problem  # the newline after 'assistant'
    assert "'assistant\\n'" not in problem and "(ids [198])" in problem and "' '" in problem


def test_a_lost_chat_template_is_reported(prepared):
    template, tokenizer = prepared("llama3", "llama3")
    written, tokenizer.chat_template = tokenizer.chat_template, None
    try:
        problem = check_rendering(tokenizer, template=template, trained=tokenizer, probes=probe_conversations(None)).problem
    finally:
        tokenizer.chat_template = written
    assert problem is not None and "no chat template" in problem


def test_merged_answers_equal_base_with_adapter_and_a_drifted_merge_is_caught(tiny_base):
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoTokenizer

    from tuneline.core.models.loading import load_model

    tokenizer = AutoTokenizer.from_pretrained(tiny_base)
    torch.manual_seed(0)
    unmerged = get_peft_model(load_model(tiny_base), LoraConfig(r=4, target_modules=["q_proj", "v_proj"],
                                                               init_lora_weights=False)).eval()
    merged = copy.deepcopy(unmerged).merge_and_unload().eval()
    prompts = [tokenizer.encode("the cat sat on"), tokenizer.encode("two and two make")]
    kwargs = {"tokenizer": tokenizer, "prompts": prompts, "stops": [tokenizer.eos_token_id], "max_new_tokens": 8}
    assert answers_problem(merged, unmerged, **kwargs) is None
    with torch.no_grad():
        merged.lm_head.weight.mul_(-1.0)  # a merge that went wrong
    problem = answers_problem(merged, unmerged, **kwargs)
    assert problem is not None and problem.startswith("the merged model answers probe prompt 0 differently")
    assert "first differ at answer token 0" in problem
