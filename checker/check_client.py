"""``tether check-client``: a scripted RLlink server that checks one client program.

PettingZoo gives environment authors ``api_test``; this is the same for SDK
authors. The checker listens on a port, waits for one client program (which
may connect several times in a row), and walks it through protocol 1.3
(docs/protocol.md §16.2, docs/check-client.md):

* handshake: PING with ``protocol_version``, GET_CONFIG, GET_STATE;
* records: valid against SET_CONFIG's spaces, Box actions recorded raw (the
  engine gets them clipped), ``action_logp`` computed with the served model;
* exactly-once batches: ``client_session`` and ``batch_seq`` 1, 2, 3, ...;
* an ERROR answer the client survives without resending the refused batch;
* a model swap: later records computed with the new model;
* a dropped connection: reconnect, handshake, resend with the same session+seq,
  then go on after the duplicate's answer;
* garbage from the server (a bad frame header): drop the connection, reconnect;
* a connection-level ERROR (CLIENT_TIMEOUT) and close: reconnect, lose nothing;
* heartbeats: an idle client PINGs every ``heartbeat_interval_s``.

It prints one row per check and exits with the number of failed checks. It
speaks raw bytes through the protocol core and serves two fixed ONNX models;
nothing is trained.
"""

from __future__ import annotations

import argparse
import asyncio

from .client_checker import HEARTBEAT_S, ClientChecker


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    parser.add_argument("--port", type=int, default=5556, help="port to listen on; 0 picks a free one (default: 5556)")
    parser.add_argument("--timeout", type=float, default=120.0, help="give up after this many seconds (default: 120)")
    parser.add_argument("--heartbeat-interval", type=float, default=HEARTBEAT_S,
                        help="heartbeat_interval_s announced in SET_CONFIG (default: 0.5)")
    parser.add_argument("--auth-token", default=None, help="require this token in PING")
    parser.add_argument("--verbose", action="store_true", help="print what the script does")


def main(args: argparse.Namespace) -> int:
    """Entry point of ``tether check-client``: exit status = number of failed checks."""
    checker = ClientChecker(args.host, args.port, args.timeout, args.heartbeat_interval, args.auth_token, args.verbose)
    return asyncio.run(checker.run())
