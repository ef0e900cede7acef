"""Offline policy files (§20): what a client needs to act with no server.

A server writes one beside its final policies (``offline_policy.json``): the PONG, SET_CONFIG and
SET_STATE a client would receive from it, as one JSON object. A client given the file acts exactly as
if it had connected to that server and received those answers (the same spaces, mapping rules,
groups, recurrent state, environment parameters and models), but nothing is recorded for training and
nothing is sent: an engine can play with a trained policy, or record demonstrations with it (§18),
where no server runs. Every SDK parses it with the same checks (tests/conformance/offline_policy.json).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .messages import MessageType

FORMAT = "tether-offline-policy"
VERSION = 1
#: The file's name in a server's logdir.
FILE_NAME = "offline_policy.json"
#: The members holding the three messages, and each one's ``type``.
_MESSAGES = (("pong", MessageType.PONG.value), ("config", MessageType.SET_CONFIG.value),
             ("state", MessageType.SET_STATE.value))


class OfflinePolicyError(ValueError):
    """An offline policy file that cannot be used; the message names what is wrong, ``code`` is
    INVALID_JSON (not JSON), INVALID_FIELD (anything else in the file) or INVALID_ARGUMENT (no file
    to read), as the C++ and C# SDKs report it."""

    def __init__(self, message: str, code: str = "INVALID_FIELD") -> None:
        super().__init__(message)
        self.code = code


def offline_policy(pong: dict[str, Any], config: dict[str, Any], state: dict[str, Any]) -> dict[str, Any]:
    """The file's object for these three messages (a SET_STATE holding every module's model)."""
    return {"format": FORMAT, "version": VERSION, "pong": pong, "config": config, "state": state}


def parse_offline_policy(text: str | bytes) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """(PONG, SET_CONFIG, SET_STATE) of an offline policy file's text, checked as §20 says; raises
    ``OfflinePolicyError`` naming what is wrong. The messages themselves are then taken as a client
    takes them from a server (a bad space or model is refused there, as from a server)."""
    try:
        body = json.loads(text)
    except (ValueError, UnicodeDecodeError) as exc:
        raise OfflinePolicyError(f"not JSON: {exc}", "INVALID_JSON") from None
    if not isinstance(body, dict):
        raise OfflinePolicyError("not a JSON object")
    if body.get("format") != FORMAT:
        raise OfflinePolicyError(f"format is {body.get('format')!r}, not {FORMAT!r}: not an offline policy file")
    version = body.get("version")
    if type(version) is not int or version != VERSION:
        raise OfflinePolicyError(f"version {version!r} is not supported (this reader takes {VERSION})")
    messages = []
    for member, kind in _MESSAGES:
        message = body.get(member)
        if not isinstance(message, dict):
            raise OfflinePolicyError(f"{member} is missing or not a JSON object")
        if message.get("type") != kind:
            raise OfflinePolicyError(f"{member} is not a {kind} message (type {message.get('type')!r})")
        messages.append(message)
    return messages[0], messages[1], messages[2]


def read_offline_policy(path: str | Path) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """``parse_offline_policy`` of the file at ``path``; a file that cannot be read is an
    ``OfflinePolicyError`` naming it, as is every other fault (prefixed with the path)."""
    try:
        text = Path(path).read_bytes()
    except OSError as exc:
        raise OfflinePolicyError(f"offline policy {str(path)!r}: cannot be read: {exc.strerror or exc}",
                                 "INVALID_ARGUMENT") from None
    try:
        return parse_offline_policy(text)
    except OfflinePolicyError as exc:
        raise OfflinePolicyError(f"offline policy {str(path)!r}: {exc}", exc.code) from None
