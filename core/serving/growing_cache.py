"""A KV cache layer with spare columns, so that a decoding step writes its keys and values in place.

transformers' DynamicLayer concatenates every step: the whole cache of the batch is copied into a new,
one column longer tensor, layer by layer. Written in place, a step costs what its own column does.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import DynamicLayer


class GrowingLayer(DynamicLayer):
    """A cache layer whose keys and values are the first `length` columns of buffers with spare columns: a
    step writes its column in place, where a DynamicLayer copies the whole cache into a longer one. Full
    buffers grow by SPARE_COLUMNS at once."""

    SPARE_COLUMNS = 32

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, *, length: int) -> None:
        super().__init__()
        self.lazy_initialization(keys, values)
        self.buffers = (keys, values)
        self.keys, self.values = keys[:, :, :length], values[:, :, :length]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: object, **kwargs: object):
        start = self.keys.shape[2]
        end = start + key_states.shape[2]
        if end > self.buffers[0].shape[2]:
            self.buffers = tuple(torch.nn.functional.pad(buffer[:, :, :start], (0, 0, 0, end - start + self.SPARE_COLUMNS))
                                 for buffer in self.buffers)
        for buffer, states in zip(self.buffers, (key_states, value_states)):
            buffer[:, :, start:end] = states
        self.keys, self.values = self.buffers[0][:, :, :end], self.buffers[1][:, :, :end]
        return self.keys, self.values
