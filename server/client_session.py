"""What the server remembers about one connected client, per connection and on every
transport. (Not the exactly-once ``client_session`` a client names in its batches: that
outlives connections, see batch_dedup and session_owners.)"""

from __future__ import annotations

import itertools
from typing import Any


class ClientSession:
    """What the server remembers about one connected client."""

    _ids = itertools.count(1)

    def __init__(self, peer: Any, websocket: bool = False) -> None:
        self.id = next(self._ids)
        self.peer = peer
        #: RLlink over a websocket (§3.4): a group's ranks are named to TCP clients only (§6.7).
        self.websocket = websocket
        #: weights_seq_no per module last sent to this client; used when a client omits it.
        self.last_sent: dict[str, int] = {}
        #: weights_seq_no per module whose model (onnx_file) this connection was sent: it holds it.
        self.models_sent: dict[str, int] = {}
        #: Agent steps of this connection's data not stored as stale since its last SET_STATE (§13.2).
        self.refused_stale = 0
