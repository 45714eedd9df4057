"""SFT packing (BEHAVIOUR.md §6) and the collator that keeps packed examples apart.

The data tests check packs against hand-computed knapsack groupings. The model tests run tiny
randomly initialised Llama and Qwen2 models: with neat packing each packed example's logits must
equal its logits alone; with plain packing the later examples see the earlier ones.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM
from transformers.modeling_flash_attention_utils import prepare_fa_kwargs_from_position_ids

from tuneline.core.data.packing import encode_packed_supervised_rows, knapsack_groups, pack_examples
from tuneline.core.data.processors import IGNORE_INDEX, RowEncoding, infer_seqlen
from tuneline.core.errors import ConfigError, DataError
from tuneline.core.templates.conversation import fix_tokenizer, get_template
from tuneline.core.training.collators import PackedCollator, block_causal_mask, flatten_for_varlen, pad_packed_features

M = IGNORE_INDEX
PAD = 0


def _example(*tokens: int, trained_from: int = 1) -> dict[str, list[int]]:
    """An example whose first `trained_from` tokens are prompt (label -100)."""
    ids = list(tokens)
    return {"input_ids": ids, "attention_mask": [1] * len(ids), "labels": [M] * trained_from + ids[trained_from:]}


# ---------------------------------------------------------------- knapsack


@pytest.mark.parametrize(
    ("lengths", "capacity", "expected"),
    [
        # sorted [2, 3, 3, 5, 7]: 7 then 2 (room 0); 5 then the later 3 (index 3), room 1; the other 3
        ([5, 3, 7, 3, 2], 9, [[2, 4], [0, 3], [1]]),
        ([4, 4, 4], 8, [[2, 1], [0]]),  # equal lengths: the later index first
        ([1, 2, 3, 4], 10, [[3, 2, 1, 0]]),  # everything fits: longest first
        ([6, 6, 6], 6, [[2], [1], [0]]),
        ([], 5, []),
    ],
)
def test_knapsack_takes_the_longest_that_fits(lengths, capacity, expected):
    assert knapsack_groups(lengths, capacity) == expected


def test_knapsack_refuses_an_example_longer_than_a_pack():
    with pytest.raises(ValueError, match=r"\[12\]"):
        knapsack_groups([3, 12], 10)


# ---------------------------------------------------------------- packs


EXAMPLES = [_example(11, 12, 13), _example(21, 22, 23, 24, 25), _example(31, 32)]


def test_plain_packs_pad_to_cutoff_len_with_mask_one():
    packs = pack_examples(EXAMPLES, cutoff_len=8, pad_token_id=PAD, neat_packing=False)
    # capacity 7: lengths [3, 5, 2] -> [5, 2] and [3]
    assert packs == [
        {
            "input_ids": [21, 22, 23, 24, 25, 31, 32, PAD],
            "attention_mask": [1] * 8,
            "position_ids": [0, 1, 2, 3, 4, 0, 1, 0],
            "labels": [M, 22, 23, 24, 25, M, 32, M],
        },
        {
            "input_ids": [11, 12, 13, PAD, PAD, PAD, PAD, PAD],
            "attention_mask": [1] * 8,
            "position_ids": [0, 1, 2, 0, 0, 0, 0, 0],
            "labels": [M, 12, 13, M, M, M, M, M],
        },
    ]


def test_neat_packs_number_the_segments():
    packs = pack_examples(EXAMPLES, cutoff_len=8, pad_token_id=PAD, neat_packing=True)
    assert [p["attention_mask"] for p in packs] == [[1, 1, 1, 1, 1, 2, 2, 0], [1, 1, 1, 0, 0, 0, 0, 0]]
    assert [p["position_ids"] for p in packs] == [[0, 1, 2, 3, 4, 0, 1, 0], [0, 1, 2, 0, 0, 0, 0, 0]]
    plain = pack_examples(EXAMPLES, cutoff_len=8, pad_token_id=PAD, neat_packing=False)
    assert [p["input_ids"] for p in packs] == [p["input_ids"] for p in plain]


def test_a_full_pack_still_ends_with_padding():
    # cutoff_len 10 leaves room for 9: 5 + 3 fits, 5 + 3 + 2 = 10 does not
    packs = pack_examples(EXAMPLES, cutoff_len=10, pad_token_id=PAD, neat_packing=True)
    assert [p["attention_mask"] for p in packs] == [[1] * 5 + [2] * 3 + [0] * 2, [1, 1] + [0] * 8]
    packs = pack_examples(EXAMPLES, cutoff_len=11, pad_token_id=PAD, neat_packing=True)
    assert packs[0]["attention_mask"] == [1] * 5 + [2] * 3 + [3] * 2 + [0]
    assert packs[0]["input_ids"] == [21, 22, 23, 24, 25, 11, 12, 13, 31, 32, PAD]


def test_packs_do_not_cross_a_batch_of_rows():
    rows = [_example(11, 12), None, _example(31, 32)]  # None: a row that gave no example
    assert len(pack_examples(rows, cutoff_len=8, pad_token_id=PAD, neat_packing=False)) == 1
    packs = pack_examples(rows, cutoff_len=8, pad_token_id=PAD, neat_packing=False, batch_size=2)
    assert [p["input_ids"][:2] for p in packs] == [[11, 12], [31, 32]]


def test_an_example_longer_than_cutoff_len_minus_one_is_refused():
    with pytest.raises(DataError, match=r"examples \[2\] .* cutoff_len - 1 = 7"):
        pack_examples([_example(1), None, _example(*range(1, 9))], cutoff_len=8, pad_token_id=PAD, neat_packing=False)
    with pytest.raises(ConfigError):
        pack_examples([], cutoff_len=1, pad_token_id=PAD, neat_packing=False)


def _words(letter: str, n: int) -> str:
    return letter + f" {letter}" * (n - 1)


def test_rows_are_cut_to_cutoff_len_minus_one_then_packed(shared_dir):
    tokenizer = AutoTokenizer.from_pretrained(shared_dir / "tokenizers" / "gpt2")
    fix_tokenizer(get_template("empty"), tokenizer)
    row = {
        "prompt": [{"role": "user", "content": _words("a", 60)}],
        "response": [{"role": "assistant", "content": _words("b", 40)}],
        "system": "",
        "tools": "",
    }
    encoding = RowEncoding(template=get_template("empty"), cutoff_len=51)
    (pack,) = encode_packed_supervised_rows([row], tokenizer=tokenizer, encoding=encoding, neat_packing=True)
    # truncated to 50: infer_seqlen(60, 40, 50) = (30, 20); then one pad token up to 51
    assert infer_seqlen(60, 40, 50) == (30, 20)
    a, b = (tokenizer.encode(_words(x, n)) for x, n in (("a", 60), ("b", 40)))
    assert pack["input_ids"] == a[:30] + b[:20] + [tokenizer.pad_token_id]
    assert pack["labels"] == [M] * 30 + b[:20] + [M]
    assert pack["attention_mask"] == [1] * 50 + [0]
    assert pack["position_ids"] == list(range(50)) + [0]


# ---------------------------------------------------------------- masks


def test_block_causal_mask_is_causal_within_segments_only():
    mask = block_causal_mask(torch.tensor([[1, 1, 2, 2, 2, 0]]))
    o, x = True, False
    assert mask.shape == (1, 1, 6, 6)
    assert mask[0, 0].tolist() == [
        [o, x, x, x, x, x],
        [o, o, x, x, x, x],
        [x, x, o, x, x, x],
        [x, x, o, o, x, x],
        [x, x, o, o, o, x],
        [x, x, x, x, x, o],  # padding sees only itself, so no row is empty
    ]
    additive = block_causal_mask(torch.tensor([[1, 1, 2, 2, 2, 0]]), dtype=torch.float32)
    assert torch.equal(additive == 0, mask)
    assert additive.min().item() == torch.finfo(torch.float32).min


def test_varlen_flattening_drops_padding_and_matches_transformers():
    packs = pack_examples(EXAMPLES, cutoff_len=8, pad_token_id=PAD, neat_packing=True)
    flat = flatten_for_varlen(pad_packed_features(packs, pad_token_id=PAD))
    assert flat["input_ids"].tolist() == [[21, 22, 23, 24, 25, 31, 32, 11, 12, 13]]
    assert flat["position_ids"].tolist() == [[0, 1, 2, 3, 4, 0, 1, 0, 1, 2]]
    # the first label of each row is never a target; flattened, it would become one
    assert flat["labels"].tolist() == [[M, 22, 23, 24, 25, M, 32, M, 12, 13]]
    assert flat["cu_seq_lens_q"].tolist() == [0, 5, 7, 10]
    assert (flat["max_length_q"], flat["max_length_k"]) == (5, 5)
    (cu_q, cu_k), (max_q, _) = prepare_fa_kwargs_from_position_ids(flat["position_ids"])
    assert torch.equal(flat["cu_seq_lens_q"], cu_q) and torch.equal(flat["cu_seq_lens_k"], cu_k)
    assert int(max_q) == flat["max_length_q"]


def test_unknown_attention_implementation_is_refused():
    with pytest.raises(ConfigError, match="did you mean 'sdpa'"):
        PackedCollator(pad_token_id=PAD, attn_implementation="spda")


# ---------------------------------------------------------------- tiny models

VOCAB = 128
LENGTHS = (7, 5, 3, 9, 6)  # cutoff_len 16 packs [9, 6], [7, 5, 3]
CUTOFF_LEN = 16


def _tiny_model(kind: str) -> torch.nn.Module:
    shape = dict(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, initializer_range=0.2,
    )
    torch.manual_seed(0)
    if kind == "llama":
        return LlamaForCausalLM(LlamaConfig(**shape)).eval()
    return Qwen2ForCausalLM(Qwen2Config(**shape)).eval()


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def tiny_model(request):
    return _tiny_model(request.param)


@pytest.fixture(scope="module")
def examples():
    generator = torch.Generator().manual_seed(1)
    # every token trained, so that a label wrongly counted at a row boundary changes the loss
    return [_example(*torch.randint(1, VOCAB, (n,), generator=generator).tolist(), trained_from=0) for n in LENGTHS]


def _logits(model, **inputs) -> torch.Tensor:
    with torch.no_grad():
        return model(**inputs, use_cache=False).logits


def _segments(pack: dict) -> list[tuple[int, int]]:
    """(start, end) of each packed example: positions restart at 0, padding (id 0) comes last."""
    tokens, positions = pack["input_ids"], pack["position_ids"]
    starts = [i for i, (token, position) in enumerate(zip(tokens, positions)) if token != PAD and position == 0]
    real_end = sum(token != PAD for token in tokens)
    return list(zip(starts, starts[1:] + [real_end]))


def _segment_differences(model, packs: list[dict], packed_logits: torch.Tensor) -> list[float]:
    """Max |packed - alone| logits of every packed example, in pack order."""
    differences = []
    for row, pack in enumerate(packs):
        for start, end in _segments(pack):
            alone = _logits(model, input_ids=torch.tensor([pack["input_ids"][start:end]]))[0]
            differences.append((packed_logits[row, start:end] - alone).abs().max().item())
    return differences


@pytest.mark.parametrize("attn_implementation", ["eager", "sdpa"])
def test_neat_packing_matches_each_example_alone(tiny_model, examples, attn_implementation):
    tiny_model.set_attn_implementation(attn_implementation)
    packs = pack_examples(examples, cutoff_len=CUTOFF_LEN, pad_token_id=PAD, neat_packing=True)
    assert [p["attention_mask"].count(1) for p in packs] == [9, 7]
    batch = PackedCollator(pad_token_id=PAD, attn_implementation=attn_implementation)(packs)
    assert batch["attention_mask"].shape == (2, 1, CUTOFF_LEN, CUTOFF_LEN)
    logits = _logits(tiny_model, **batch)
    assert torch.isfinite(logits).all()  # padding rows included
    differences = _segment_differences(tiny_model, packs, logits)
    assert len(differences) == len(LENGTHS)
    assert max(differences) < 1e-4


@pytest.mark.parametrize("attn_implementation", ["eager", "sdpa"])
def test_plain_packing_attends_across_examples(tiny_model, examples, attn_implementation):
    tiny_model.set_attn_implementation(attn_implementation)
    packs = pack_examples(examples, cutoff_len=CUTOFF_LEN, pad_token_id=PAD, neat_packing=False)
    batch = pad_packed_features(packs, pad_token_id=PAD)  # what LLaMA-Factory feeds: a 2D mask of ones
    differences = _segment_differences(tiny_model, packs, _logits(tiny_model, **batch))
    first_in_pack = [differences[0], differences[2]]  # causal: the first example sees nothing else
    later_in_pack = [differences[1], differences[3], differences[4]]
    assert max(first_in_pack) < 1e-4
    assert min(later_in_pack) > 1.0  # observed: 6 to 8; neat packing: under 1e-5


def test_flattened_batch_gives_the_same_logits_and_loss(tiny_model, examples):
    """The varlen layout, checked on CPU: transformers finds the segments from position_ids."""
    tiny_model.set_attn_implementation("sdpa")
    packs = pack_examples(examples, cutoff_len=CUTOFF_LEN, pad_token_id=PAD, neat_packing=True)
    flat = PackedCollator(pad_token_id=PAD, attn_implementation="flash_attention_2")(packs)
    masked = PackedCollator(pad_token_id=PAD, attn_implementation="sdpa")(packs)
    plain_inputs = {key: flat[key] for key in ("input_ids", "position_ids", "labels")}
    with torch.no_grad():
        flat_out = tiny_model(**plain_inputs, use_cache=False)
        masked_out = tiny_model(**masked, use_cache=False)
    real = torch.tensor([p["attention_mask"] for p in packs]) != 0
    assert real.sum() == flat["input_ids"].numel() == sum(LENGTHS)
    torch.testing.assert_close(flat_out.logits[0], masked_out.logits[real], atol=1e-4, rtol=0)
    torch.testing.assert_close(flat_out.loss, masked_out.loss, atol=1e-5, rtol=0)


@pytest.mark.gpu
@pytest.mark.skipif(
    importlib.util.find_spec("flash_attn") is None or not torch.cuda.is_available(),
    reason="needs flash_attn and a CUDA device",
)
def test_flash_attention_varlen_matches_each_example_alone(examples):
    model = _tiny_model("llama").to("cuda", torch.bfloat16)
    model.set_attn_implementation("flash_attention_2")
    packs = pack_examples(examples, cutoff_len=CUTOFF_LEN, pad_token_id=PAD, neat_packing=True)
    flat = PackedCollator(pad_token_id=PAD, attn_implementation="flash_attention_2")(packs)
    flat = {k: v.to("cuda") if torch.is_tensor(v) else v for k, v in flat.items()}
    packed = _logits(model, **flat)[0].float()
    starts = flat["cu_seq_lens_q"].tolist()
    for start, end in zip(starts, starts[1:]):
        alone = _logits(model, input_ids=flat["input_ids"][:, start:end])[0].float()
        assert (packed[start:end] - alone).abs().max().item() < 2e-2
