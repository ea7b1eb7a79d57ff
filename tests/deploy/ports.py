"""Free TCP ports for the deploy tests' private clusters."""

from __future__ import annotations

import socket
from collections.abc import Sequence
from contextlib import ExitStack


def free_ports(names: Sequence[str]) -> dict[str, int]:
    """``{name: port}``: distinct ports the OS had free on 127.0.0.1, all held bound until every one is picked
    (a port picked and released one at a time can come back for the next name: two services of one cluster on
    the same port, and the second fails to start). Another process may still take one before its user binds it."""
    with ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in names]
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return {name: s.getsockname()[1] for name, s in zip(names, socks)}
