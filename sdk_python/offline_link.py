"""**[§20]** A client with no server: its configuration and models come from an offline policy file.

``OfflineLink`` stands where a ``ServerLink`` stands and gives the client, once, what a connection
would: the file's PONG, SET_CONFIG and SET_STATE (its models prepared as a server's would be, its
environment parameter set taken in). There is no I/O thread and no socket: the client records
nothing for training, so nothing is ever submitted; a request (MAP_AGENTS: agents the file's mapping
rules do not place) has nobody to answer it and is refused, naming the agent's need.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable

from tether.protocol.connection import run_id_of
from tether.protocol.errors import NotReadyError, TetherConnectionError
from tether.protocol.messages import MessageType
from tether.protocol.offline_policy import OfflinePolicyError, read_offline_policy
from .server_link import Batch, ServerLink, check_server_version


class OfflineLink(ServerLink):
    """The link of a client made with ``offline_policy=PATH``: see the module's docstring."""

    def __init__(self, path: str | Path, state_request: Callable[[bool], dict[str, Any]],
                 prepare_state: Callable[[dict[str, Any], dict[str, Any]], Any], verbose: bool = False,
                 multi_agent: bool = False) -> None:
        super().__init__("offline", 0, "offline", None, 0.0, state_request, prepare_state, verbose=verbose)
        self.path = os.fspath(path)
        self.connected_address = f"offline:{self.path}"
        self._multi_agent = multi_agent

    @property
    def address(self) -> str:
        return self.connected_address

    def start(self) -> None:
        """Read the file and post its connection. Raises what is wrong with it (the client turns every
        fault into an ``OfflinePolicyError`` naming the file: ``refusal``)."""
        info, config, state = read_offline_policy(self.path)
        check_server_version(info)
        if not self._multi_agent and "onnx_file" not in state:
            raise OfflinePolicyError("its server has no default module (it has several, or maps agents itself): a "
                                     "single-agent client has no model in it; use a multi-agent client")
        self.server_info, self.server_config = info, config
        if "env_params" in state and self.speaks(1, 7):
            self._take_env_params(state["env_params"])
        prepared = self._prepare_state(config, state)
        self._run_ids.append(run_id_of(info))
        self.connections = 1
        self._post("connected", info, config, prepared)

    def submit(self, batch: Batch) -> set[str]:
        """Nothing is sent offline (and clients record nothing to send): the batch is let go."""
        batch.done = True
        return set()

    def refusal(self, exc: BaseException) -> OfflinePolicyError:
        """What the client raises for ``exc``, raised while it took the file in: an OfflinePolicyError
        naming the file, with the code of what went wrong (a version mismatch, a space or a model a
        server could not send either)."""
        if isinstance(exc, OfflinePolicyError):
            return exc if str(exc).startswith("offline policy ") else OfflinePolicyError(
                f"offline policy {self.path!r}: {exc}", exc.code)
        code = getattr(exc, "code", None)
        code = getattr(code, "value", code)
        return OfflinePolicyError(f"offline policy {self.path!r}: {exc}",
                                  code if isinstance(code, str) else "INVALID_FIELD")

    def request(self, message: Any) -> dict[str, Any]:
        """GET_STATE (``refresh_weights``) is answered with no change: the file's models are the newest
        there are. Anything else (MAP_AGENTS) is refused: there is no server to answer. After ``close``
        every request is refused, as a closed client's."""
        if self._closing.is_set():
            raise TetherConnectionError("the client is closed", self.connected_address, "CLOSED")
        body = message() if callable(message) else message
        if body.get("type") == MessageType.GET_STATE.value:
            return {"type": MessageType.SET_STATE.value}
        raise NotReadyError(f"{body.get('type')}: an offline client has no server to ask (offline policy "
                            f"{str(self.path)!r}, whose SET_CONFIG names no policy_mapping rules for this)")

    def close(self) -> None:
        """Nothing to stop but the base's wake sockets."""
        self._closing.set()
        for s in (self._wake_r, self._wake_w):
            s.close()
