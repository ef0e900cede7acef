"""Every complete frame written out in docs/protocol.md has a header that
matches its body's length in bytes, and a body that decodes as a message."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tether.protocol import decode_message

SPEC = Path(__file__).resolve().parents[2] / "docs" / "protocol.md"
FRAME = re.compile(r"^(?:[→←] )?(\d{8})(\{.*\})(?:\s{2,}.*)?$")


def example_frames() -> list[tuple[int, str, str]]:
    frames = []
    for number, line in enumerate(SPEC.read_text().splitlines(), 1):
        match = FRAME.match(line.strip())
        if match and "…" not in match.group(2):  # shortened frames carry illustrative headers
            frames.append((number, match.group(1), match.group(2)))
    return frames


def test_the_spec_has_examples() -> None:
    assert len(example_frames()) >= 20


@pytest.mark.parametrize(("line", "header", "body"), example_frames(), ids=lambda v: str(v)[:12])
def test_example_frame_is_exact(line: int, header: str, body: str) -> None:
    assert int(header) == len(body.encode()), f"docs/protocol.md line {line}: header {header}, body {len(body.encode())} bytes"
    kind, message = decode_message(body.encode())
    assert message["type"] == kind.value
