"""TetherClient: an engine-side client in the shape of RLlib's ExternalEnv.

The engine keeps its own loop and calls::

    client = TetherClient("127.0.0.1", 5555)
    eid = client.start_episode()
    action = client.get_action(eid, obs)        # local ONNX inference, microseconds
    client.log_returns(eid, reward)
    client.end_episode(eid, final_obs)          # or truncated=True at a time limit

Experience is sent every ``env_steps_per_sample`` steps (the server's
SET_CONFIG); on-policy servers answer with new weights, which are swapped in
before the next action. Lost connections are re-established with backoff and
the unsent batch is sent again, so a server restart costs no data.
"""

from __future__ import annotations

import sys
import time
import uuid
from typing import Any

import numpy as np

from .episode_recorder import EpisodeRecorder
from .policy import OnnxPolicy
from .protocol.errors import ServerError, VersionMismatchError, server_error_from_message
from .protocol.messages import PROTOCOL_VERSION, MessageType, parse_version
from .protocol.onnx_codec import decode_onnx
from .protocol.spaces import Space, from_gymnasium, space_from_json
from .transport import SocketTransport


class TetherConnectionError(ConnectionError):
    """The server could not be reached within ``reconnect_timeout_s``."""


class TetherClient:
    """Connects to a Tether (or any RLlink v1) server and acts locally.

    Args:
        host, port: the server's address.
        client_name: shown in the server's logs.
        auth_token: sent in PING when the server requires one.
        observation_space, action_space: gymnasium or Tether spaces; needed only
            when the server does not describe them (RLlib's own v1 server).
        reconnect_timeout_s: how long to keep retrying a lost server before
            raising ``TetherConnectionError``.
        seed: seed for action sampling.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 5555,
        client_name: str = "tether-python",
        auth_token: str | None = None,
        observation_space: Any = None,
        action_space: Any = None,
        reconnect_timeout_s: float = 60.0,
        seed: int | None = None,
        verbose: bool = False,
    ) -> None:
        self.client_name = client_name
        self.auth_token = auth_token
        self.reconnect_timeout_s = reconnect_timeout_s
        self.verbose = verbose
        self._seed = seed
        self._user_obs_space: Space | None = from_gymnasium(observation_space) if observation_space is not None else None
        self._user_action_space: Space | None = from_gymnasium(action_space) if action_space is not None else None
        self._transport = SocketTransport(host, port)
        self._episodes: dict[str, EpisodeRecorder] = {}
        self._finished: list[EpisodeRecorder] = []
        self._pending_steps = 0
        self._deferred_errors: list[ServerError] = []
        self.policy: OnnxPolicy | None = None
        self.weights_seq_no: int | None = None
        self.server_config: dict[str, Any] = {}
        self.server_info: dict[str, Any] = {}
        self.env_steps_per_sample = 0
        self.force_on_policy = True
        self.observation_space: Space | None = None
        self.action_space: Space | None = None
        #: Connections re-established after a loss, and env steps delivered to the server.
        self.reconnects = 0
        self.env_steps_sent = 0
        self._connect_with_retry()

    # -- connection ------------------------------------------------------------

    def _handshake(self) -> None:
        ping: dict[str, Any] = {
            "type": MessageType.PING.value,
            "protocol_version": PROTOCOL_VERSION,
            "client_name": self.client_name,
        }
        if self.auth_token is not None:
            ping["auth_token"] = self.auth_token
        self.server_info = self._answer(self._transport.request(ping))
        server_version = self.server_info.get("protocol_version")
        if server_version is not None and parse_version(str(server_version))[0] != parse_version(PROTOCOL_VERSION)[0]:
            raise VersionMismatchError(
                "VERSION_MISMATCH", f"server speaks RLlink {server_version}, this client {PROTOCOL_VERSION}", "PING"
            )
        config = self._answer(self._transport.request({"type": MessageType.GET_CONFIG.value}))
        self.server_config = config
        self.env_steps_per_sample = int(config.get("env_steps_per_sample", 500))
        self.force_on_policy = bool(config.get("force_on_policy", True))
        self.observation_space = (
            space_from_json(config["observation_space"]) if "observation_space" in config else self._user_obs_space
        )
        self.action_space = space_from_json(config["action_space"]) if "action_space" in config else self._user_action_space
        state = self._answer(self._transport.request({"type": MessageType.GET_STATE.value}))
        self._apply_state(state)

    def _connect_with_retry(self) -> None:
        deadline = time.monotonic() + self.reconnect_timeout_s
        delay = 0.05
        while True:
            try:
                self._transport.close()
                self._transport.connect()
                self._handshake()
                return
            except (OSError, ConnectionError) as exc:
                self._transport.close()
                if time.monotonic() + delay > deadline:
                    raise TetherConnectionError(
                        f"could not reach a Tether server at {self._transport.host}:{self._transport.port} "
                        f"within {self.reconnect_timeout_s:.0f} s: {exc}"
                    ) from exc
                if self.verbose:
                    print(f"[tether-client] server unreachable ({exc}); retrying in {delay:.2f} s", file=sys.stderr)
                time.sleep(delay)
                delay = min(delay * 2, 2.0)

    def _answer(self, responses: list[tuple[MessageType | None, dict[str, Any]]]) -> dict[str, Any]:
        """The response to the request just made; raise it if it is an ERROR.

        ERRORs for earlier fire-and-forget EPISODES are kept and raised by
        ``_raise_deferred`` once the current response has been applied.
        """
        for _, message in responses[:-1]:
            self._deferred_errors.append(server_error_from_message(message))
        final = responses[-1][1]
        if final.get("type") == MessageType.ERROR.value:
            raise server_error_from_message(final)
        return final

    def _raise_deferred(self) -> None:
        if self._deferred_errors:
            error, self._deferred_errors = self._deferred_errors[0], []
            raise error

    def _roundtrip(self, message: dict[str, Any]) -> dict[str, Any]:
        """Send a request, surviving disconnects: reconnect and resend until answered."""
        while True:
            try:
                if not self._transport.connected:
                    raise ConnectionError("not connected")
                return self._answer(self._transport.request(message))
            except ServerError:
                raise
            except (OSError, ConnectionError):
                self.reconnects += 1
                self._connect_with_retry()

    def _apply_state(self, state: dict[str, Any]) -> None:
        seq = state.get("weights_seq_no")
        if "onnx_file" in state:
            model = decode_onnx(state["onnx_file"])
            names_in = self.server_config.get("onnx_input_names") or [None]
            names_out = self.server_config.get("onnx_output_names") or [None]
            self.policy = OnnxPolicy(model, self.action_space, names_in[0], names_out[0], self._seed)
            if self.action_space is None:
                self.action_space = self.policy.action_space
        if isinstance(seq, int):
            self.weights_seq_no = seq

    # -- ExternalEnv API -----------------------------------------------------------

    def start_episode(self, episode_id: str | None = None, training_enabled: bool = True) -> str:
        """Begin an episode; returns its id. Episodes may overlap."""
        episode_id = episode_id or uuid.uuid4().hex
        if episode_id in self._episodes:
            raise ValueError(f"episode {episode_id!r} is already running")
        self._episodes[episode_id] = EpisodeRecorder(episode_id, training_enabled)
        return episode_id

    def get_action(self, episode_id: str, observation: Any) -> Any:
        """Record an observation and return the policy's sampled action for it."""
        episode = self._episodes[episode_id]
        obs = np.asarray(observation, dtype=np.float32)
        if (
            episode.training_enabled
            and self._pending_steps >= self.env_steps_per_sample
            and self._sendable_steps(episode) >= self.env_steps_per_sample
        ):
            episode.obs.append(obs)  # lets the cut include the step that led here
            self._exchange()
            episode.obs.pop()
        assert self.policy is not None
        action, logp, dist = self.policy.sample(obs)
        episode.record_step(obs, action, logp, dist)
        if episode.training_enabled:
            self._pending_steps += 1
        return action

    def compute_action(self, observation: Any) -> Any:
        """The deterministic (greedy) action for an observation; records nothing."""
        assert self.policy is not None
        return self.policy.act_deterministic(np.asarray(observation, dtype=np.float32))

    def log_returns(self, episode_id: str, reward: float, info: dict | None = None) -> None:
        """Add reward to the episode's last action (rewards accumulate until the next action)."""
        self._episodes[episode_id].add_reward(float(reward))

    def end_episode(self, episode_id: str, observation: Any, truncated: bool = False) -> float:
        """Finish an episode with its last observation; returns its total reward.

        ``truncated=True`` marks an end by time limit (the value is bootstrapped);
        otherwise the episode terminated.
        """
        episode = self._episodes.pop(episode_id)
        episode.finish(np.asarray(observation, dtype=np.float32), truncated)
        if episode.training_enabled and episode.pending_steps:
            self._finished.append(episode)
        return episode.total_return

    # -- sending -------------------------------------------------------------------

    def _sendable_steps(self, current: EpisodeRecorder) -> int:
        """Steps a send would carry now: every other open episode holds back its
        last action until its next observation. RLlib's server waits for a full
        ``env_steps_per_sample`` batch, so sending fewer would stall it."""
        held = sum(
            1
            for e in self._episodes.values()
            if e is not current and e.training_enabled and e.actions and len(e.obs) == len(e.actions)
        )
        return self._pending_steps - held

    def _collect_records(self) -> list[dict[str, Any]]:
        records = []
        for episode in self._finished:
            record = episode.cut()
            if record is not None:
                records.append(record)
        self._finished.clear()
        for episode in self._episodes.values():
            if episode.training_enabled:
                record = episode.cut()
                if record is not None:
                    records.append(record)
        self._pending_steps = sum(e.pending_steps for e in self._episodes.values() if e.training_enabled)
        return records

    def _exchange(self) -> None:
        """Send the collected experience; take new weights where the server gives them."""
        records = self._collect_records()
        if not records:
            return
        steps = sum(len(r["actions"]) for r in records)
        if self.force_on_policy:
            message = {
                "type": MessageType.EPISODES_AND_GET_STATE.value,
                "episodes": records,
                "env_steps": steps,
                "weights_seq_no": self.weights_seq_no,
            }
            self._apply_state(self._roundtrip(message))
            self.env_steps_sent += steps
        else:
            message = {"type": MessageType.EPISODES.value, "episodes": records, "env_steps": steps,
                       "weights_seq_no": self.weights_seq_no}
            try:
                self._transport.send(message)
            except (OSError, ConnectionError):
                self.reconnects += 1
                self._connect_with_retry()
                self._transport.send(message)
            self.refresh_weights()
            self.env_steps_sent += steps

    def refresh_weights(self) -> None:
        """Ask for the current weights (GET_STATE); the model is swapped if it changed.

        Raises ``ServerError`` for a refused earlier EPISODES message (after the
        weights were applied).
        """
        self._apply_state(self._roundtrip({"type": MessageType.GET_STATE.value, "weights_seq_no": self.weights_seq_no}))
        self._raise_deferred()

    def flush(self) -> None:
        """Send whatever experience is complete now, without waiting for a full sample."""
        self._exchange()

    def close(self) -> None:
        """Close the connection (unsent experience is dropped)."""
        self._transport.close()

    def __enter__(self) -> "TetherClient":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
