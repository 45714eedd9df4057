"""The server's decoding settings: the batch and queue sizes from flags or the environment (every wrong one
named at once), torch's threads leaving a core to the HTTP loop, and a listening socket whose connections
send small answers at once (no Nagle delay for keep-alive clients)."""

from __future__ import annotations

import socket

import pytest

from tuneline.core.errors import ConfigError
from tuneline.core.serving.batching import DEFAULT_MAX_BATCH, DEFAULT_QUEUE_SIZE
from tuneline.core.serving.server import ServerSettings, bind, torch_threads, with_decoding


def test_batch_and_queue_sizes_come_from_flags_else_the_environment():
    base = ServerSettings(port=0)
    assert (with_decoding(base, {}).max_batch, with_decoding(base, {}).queue_size) == (DEFAULT_MAX_BATCH, DEFAULT_QUEUE_SIZE)
    from_env = with_decoding(base, {"API_MAX_BATCH": "4", "API_QUEUE_SIZE": "9"})
    assert (from_env.max_batch, from_env.queue_size) == (4, 9)
    flags_win = with_decoding(base, {"API_MAX_BATCH": "4", "API_QUEUE_SIZE": "9"}, max_batch=2, queue_size=3)
    assert (flags_win.max_batch, flags_win.queue_size) == (2, 3)


def test_wrong_sizes_are_each_named():
    with pytest.raises(ConfigError) as raised:
        with_decoding(ServerSettings(port=0), {"API_MAX_BATCH": "many"}, queue_size=0)
    problems = raised.value.problems
    assert len(problems) == 2
    assert problems[0].startswith("API_MAX_BATCH='many' is not a positive whole number")
    assert problems[1].startswith("--queue-size 0 is not a positive whole number")


def test_torch_leaves_a_core_to_the_event_loop_unless_told_otherwise():
    assert [torch_threads({}, cores=cores) for cores in (1, 2, 16)] == [1, 1, 15]
    assert torch_threads({"OMP_NUM_THREADS": "4"}, cores=16) is None


def test_accepted_connections_send_without_nagle_delay():
    server = bind(ServerSettings(port=0))
    client = socket.create_connection(server.getsockname())
    accepted, _ = server.accept()
    try:
        # asyncio sets TCP_NODELAY only on sockets whose protocol is TCP; an accepted socket takes the listener's
        assert accepted.proto == socket.IPPROTO_TCP
    finally:
        for sock in (accepted, client, server):
            sock.close()
