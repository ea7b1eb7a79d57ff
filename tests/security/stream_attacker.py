"""Another process pushing hostile messages at a spot-trainer replica's hidden-state endpoint (ZeroMQ PUSH).

    python -m tests.security.stream_attacker ENDPOINT [KEYED_TOKEN]

Sends, in order: random bytes (one part), four random parts, a well-formed frame without a MAC, the same
frame with a wrong MAC; and with ``KEYED_TOKEN`` (a sender that holds the key: a buggy or compromised rollout
actor) a frame at policy version 10**12, one with token ids outside any vocabulary, one with NaN hidden states
and one whose header is not JSON, each with a valid MAC. Prints the number of messages sent.
"""

from __future__ import annotations

import os
import sys

import torch
import zmq

from services.spot_trainer.buffer import Frame
from services.spot_trainer.stream import encode_frame, frame_mac, stream_key


def _frame(version: int = 0, tokens=None, hidden=None) -> Frame:
    n = 8
    return Frame(
        version,
        "hostile",
        torch.arange(n),
        torch.randn(n, 1, 64) if hidden is None else hidden,
        torch.zeros(n, dtype=torch.long) if tokens is None else tokens,
    )


def main() -> None:
    endpoint = sys.argv[1]
    token = sys.argv[2] if len(sys.argv) > 2 else None
    sock = zmq.Context.instance().socket(zmq.PUSH)
    sock.setsockopt(zmq.LINGER, 10_000)  # deliver everything before exit
    sock.connect(endpoint)
    plain = [bytes(p) for p in encode_frame(_frame())]
    messages = [
        [os.urandom(64)],
        [os.urandom(16) for _ in range(4)],
        plain,
        plain + [os.urandom(32)],
    ]
    if token:
        key = stream_key(token)
        hostile = [
            [bytes(p) for p in encode_frame(_frame(version=10**12))],
            [bytes(p) for p in encode_frame(_frame(tokens=torch.full((8,), 10**6, dtype=torch.long)))],
            [bytes(p) for p in encode_frame(_frame(hidden=torch.full((8, 1, 64), float("nan"))))],
            [b"{not json", b"", b"", b""],
        ]
        messages += [parts + [frame_mac(key, parts)] for parts in hostile]
    for parts in messages:
        sock.send_multipart(parts)
    sock.close()
    print(len(messages))


if __name__ == "__main__":
    main()
