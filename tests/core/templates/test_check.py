"""The template checks that stay errors: markers and stop words the tokenizer cannot write.

(The rendering comparison, `check_template`, is tested in test_auto.py.)
"""

from __future__ import annotations

import copy

from tuneline.core.templates.check import template_markers, vocabulary_problems
from tuneline.core.templates.conversation import fix_tokenizer, get_template


def _problems(load, template_name: str, tokenizer_name: str, *, resize_vocab: bool = False) -> list[str]:
    tokenizer = copy.deepcopy(load(tokenizer_name))
    template = get_template(template_name)
    original_vocab = set(tokenizer.get_vocab())
    fix_tokenizer(template, tokenizer)
    return vocabulary_problems(template, tokenizer, original_vocab=original_vocab, resize_vocab=resize_vocab)


def test_markers_are_the_control_tokens_of_the_slots():
    assert template_markers(get_template("chatml")) == ["<|im_start|>", "<|im_end|>"]
    assert template_markers(get_template("phi")) == ["<|system|>", "<|end|>", "<|user|>", "<|assistant|>"]
    assert template_markers(get_template("chatglm3")) == ["[gMASK]", "sop", "<|system|>", "<|user|>", "<|assistant|>",
                                                          "<|observation|>"]
    # plain-text formats: llama2's [INST] and <<SYS>>, Qwen's <tool_response> are text in the official formats
    assert template_markers(get_template("llama2")) == []
    assert template_markers(get_template("qwen")) == ["<|im_start|>", "<|im_end|>"]
    # control tokens of other shapes: listed by the template, or a stop word written in a slot
    assert template_markers(get_template("gemma")) == ["<start_of_turn>", "<end_of_turn>"]
    assert template_markers(get_template("glm4")) == ["[gMASK]", "<sop>", "<|system|>", "<|user|>", "<|assistant|>",
                                                      "<|observation|>"]
    assert template_markers(get_template("baichuan2")) == ["<reserved_106>", "<reserved_107>"]
    assert template_markers(get_template("exaone")) == ["[|system|]", "[|endofturn|]", "[|user|]", "[|assistant|]"]
    assert template_markers(get_template("intern")) == ["<|System|>", "<|User|>", "<|Bot|>", "<eoa>"]


def test_llamafactory_combinations_have_no_vocabulary_problem(load):
    for template_name, tokenizer_name in [("llama2", "llama2"), ("default", "llama3"), ("vicuna", "qwen2.5"),
                                          ("chatml", "qwen2.5"), ("phi", "phi3.5"), ("llama3", "llama3"),
                                          ("mistral", "mistral-v0.3"), ("default", "gpt2")]:
        assert _problems(load, template_name, tokenizer_name) == [], (template_name, tokenizer_name)


def test_a_marker_split_into_pieces_is_a_problem_even_with_resize_vocab(load):
    problems = _problems(load, "phi", "llama2", resize_vocab=True)
    assert len(problems) == 3  # <|system|>, <|user|>, <|assistant|> split; <|end|> was added as eos, one token
    assert problems[0].startswith("template 'phi' writes the marker '<|system|>', which this tokenizer splits into")


def test_a_marker_the_fix_adds_needs_resize_vocab(load):
    problems = _problems(load, "chatml", "gpt2")
    assert problems == ["template 'chatml' writes the token(s) '<|im_start|>', '<|im_end|>', which this tokenizer does "
                        "not have: they were added, with no embedding in the model; set 'resize_vocab: true' to grow "
                        "the embeddings, or use the template that matches the model's tokenizer."]
    assert _problems(load, "chatml", "gpt2", resize_vocab=True) == []
