"""The server's log lines, written so that writing one can never fail what the server was doing.

A server whose stderr was closed (its terminal went away, a pipe's reader died) must keep training
and serving: a failed write raises, and in the middle of publishing an update that would leave
waiting clients and the state half updated. The line is lost; nothing else is.
"""

from __future__ import annotations

import sys
from typing import TextIO


def say(line: str, stream: TextIO | None = None) -> None:
    """Write ``line`` to ``stream`` (stderr by default) and flush it; a failed write is ignored."""
    try:
        print(line, file=stream if stream is not None else sys.stderr, flush=True)
    except (OSError, ValueError):  # (a closed or broken stream)
        pass
