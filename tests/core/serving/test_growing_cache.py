"""The serving cache layer with spare columns: its keys and values after any sequence of writes are the
columns a DynamicLayer (which concatenates) holds, across the growth of its buffers."""

from __future__ import annotations


def test_writes_in_place_hold_what_concatenation_holds_across_growth():
    import torch
    from transformers.cache_utils import DynamicLayer

    from tuneline.core.serving.growing_cache import GrowingLayer

    generator = torch.Generator().manual_seed(0)
    start = torch.randn(3, 2, 5, 4, generator=generator), torch.randn(3, 2, 5, 4, generator=generator)
    buffers = [torch.nn.functional.pad(tensor, (0, 0, 0, 2)) for tensor in start]  # 2 spare columns
    growing, concatenating = GrowingLayer(*buffers, length=5), DynamicLayer()
    concatenating.update(*start)
    capacities = []
    for columns in [1, 1, 1, 3, 1, 40, 1]:
        new = torch.randn(3, 2, columns, 4, generator=generator), torch.randn(3, 2, columns, 4, generator=generator)
        keys, values = growing.update(*new)
        expected_keys, expected_values = concatenating.update(*new)
        assert torch.equal(keys, expected_keys) and torch.equal(values, expected_values)
        assert growing.get_seq_length() == concatenating.get_seq_length()
        capacities.append(growing.buffers[0].shape[2])
    spare = GrowingLayer.SPARE_COLUMNS  # the third write outgrows the 2 spare columns, the sixth the grown buffers
    assert capacities == [7, 7, 8 + spare, 8 + spare, 8 + spare, 52 + spare, 52 + spare]
