"""`relay broker`'s look at its port before it starts a broker there."""

from __future__ import annotations

import socket

import pytest

from tools.cli import cannot_listen


def test_a_port_with_connections_still_closing_is_free_to_listen_on() -> None:
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", 0))
    port = server.getsockname()[1]
    server.listen()
    client = socket.create_connection(("127.0.0.1", port))
    accepted, _ = server.accept()
    assert cannot_listen("127.0.0.1", port) is not None  # a listener is there
    accepted.close()  # the side that closes first keeps the port in TIME_WAIT
    client.close()
    server.close()
    with socket.socket() as plain, pytest.raises(OSError):
        plain.bind(("127.0.0.1", port))  # what a look without SO_REUSEADDR met
    assert cannot_listen("127.0.0.1", port) is None
