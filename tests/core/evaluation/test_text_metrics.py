"""BLEU-4 and ROUGE-1/2/L as LLaMA-Factory computes them, against values worked out by hand."""

from __future__ import annotations

import math

import pytest

from tuneline.core.evaluation.text_metrics import mean_similarity, rouge_words, segment, sentence_bleu4, similarity


def test_identical_strings_score_100_everywhere():
    assert similarity("The capital of France is Paris.", "The capital of France is Paris.") == {
        "bleu-4": 100.0, "rouge-1": 100.0, "rouge-2": 100.0, "rouge-l": 100.0}


def test_bleu_without_smoothing_is_the_geometric_mean_of_character_precisions():
    # "the cat sat" vs "the cat ran", 11 characters each (brevity penalty 1):
    # 1-grams 9/11 (t x2, h, e, space x2, c, a x2), 2-grams 7/10, 3-grams 6/9, 4-grams 5/8
    # (9*7*6*5 / (11*10*9*8)) ** 0.25 = (1890/7920) ** 0.25 = 0.698931
    assert similarity("the cat sat", "the cat ran")["bleu-4"] == 69.8931


def test_bleu_method3_smooths_each_unmatched_order_by_a_doubling_factor():
    # "abcd" vs "abce": 3/4, 2/3, 1/2, and the 4-gram 0/1 becomes 1/(2^1 * 1) = 1/2
    # (3/4 * 2/3 * 1/2 * 1/2) ** 0.25 = (1/8) ** 0.25 = 2 ** -0.75
    assert sentence_bleu4(list("abcd"), list("abce")) == pytest.approx(2 ** -0.75)
    assert similarity("abcd", "abce")["bleu-4"] == 59.4604


def test_bleu_method3_keeps_the_unreduced_ngram_count_and_applies_the_brevity_penalty():
    # "a a a" (5 characters) vs "a": 1-grams 1/5; 2-grams 0/4 -> 1/(2*4); 3-grams 0/3 -> 1/(4*3);
    # 4-grams 0/2 -> 1/(8*2); longer than the label, so no penalty: (1/7680) ** 0.25 = 0.106822
    assert similarity("a a a", "a")["bleu-4"] == 10.6822
    # "ab" vs "abcd": 2/2, 1/1, no 3-gram 0/1 -> 1/2, no 4-gram 0/1 -> 1/4; (1/8) ** 0.25 times the
    # brevity penalty exp(1 - 4/2) = 0.594604 * 0.367879 = 0.218742
    assert sentence_bleu4(list("ab"), list("abcd")) == pytest.approx(2 ** -0.75 * math.exp(-1))
    assert similarity("ab", "abcd")["bleu-4"] == 21.8742


def test_bleu_is_zero_without_a_single_matching_character():
    assert similarity("xyz", "abc")["bleu-4"] == 0.0


def test_rouge_on_words():
    # words {the, cat, sat} vs {the, cat, ran}: 2 of 3 either way, F = 2/3 -> 66.6667
    # bigrams {the cat, cat sat} vs {the cat, cat ran}: 1 of 2 -> 50; longest common subsequence 2 of 3
    scores = similarity("the cat sat", "the cat ran")
    assert (scores["rouge-1"], scores["rouge-2"], scores["rouge-l"]) == (66.6667, 50.0, 66.6667)


def test_rouge_n_counts_distinct_ngrams_and_rouge_l_counts_every_word():
    # rouge_chinese compares n-gram *sets*: {a} vs {a} is a perfect ROUGE-1, while ROUGE-L sees
    # 3 predicted words with a common subsequence of 1: P = 1/3, R = 1, F = 0.5
    scores = similarity("a a a", "a")
    assert (scores["rouge-1"], scores["rouge-2"], scores["rouge-l"]) == (100.0, 0.0, 50.0)


def test_chinese_is_scored_character_by_character():
    # 我 爱 北 京 vs 我 爱 上 海: ROUGE-1 2/4 -> 50; bigrams {我爱, 爱北, 北京} vs {我爱, 爱上, 上海}: 1/3;
    # LCS 2 of 4 -> 50. BLEU: 2/4, 1/3, 3-grams 0/2 -> 1/(2*2), 4-grams 0/1 -> 1/(4*1):
    # (1/2 * 1/3 * 1/4 * 1/4) ** 0.25 = (1/96) ** 0.25 = 0.319472
    assert similarity("我爱北京", "我爱上海") == {"bleu-4": 31.9472, "rouge-1": 50.0, "rouge-2": 33.3333, "rouge-l": 50.0}


def test_an_empty_prediction_scores_zero():
    assert similarity("", "An emerald is green.") == {"bleu-4": 0.0, "rouge-1": 0.0, "rouge-2": 0.0, "rouge-l": 0.0}
    assert similarity("   ", "green") == {"bleu-4": 0.0, "rouge-1": 0.0, "rouge-2": 0.0, "rouge-l": 0.0}


def test_segmentation_splits_cjk_characters_words_and_punctuation():
    assert segment("Hello, 世界! x2 don't\nok") == ["Hello", ",", "世", "界", "!", "x2", "don", "'", "t", "\n", "ok"]


def test_rouge_words_cut_sentences_as_rouge_chinese_does():
    # a newline right after a sentence end leaves a whitespace-only sentence, which rouge_chinese
    # turns into one empty word
    assert rouge_words("你好。\n世界") == ["你", "好", "。", "", "世", "界"]
    assert rouge_words("Two  words") == ["Two", "words"]


def test_mean_similarity_averages_the_examples():
    means = mean_similarity(["abcd", "same"], ["abce", "same"])
    assert means["bleu-4"] == pytest.approx((59.4604 + 100.0) / 2)
    assert means["rouge-1"] == pytest.approx((0.0 + 100.0) / 2)  # "abcd" and "abce" are different words
    assert mean_similarity([], []) == {"bleu-4": 0.0, "rouge-1": 0.0, "rouge-2": 0.0, "rouge-l": 0.0}
