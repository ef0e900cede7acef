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

import uuid
from typing import Any

import numpy as np

from .episode_recorder import EpisodeRecorder
from .policy import OnnxPolicy
from .protocol.distributions import to_env_action
from .protocol.messages import MessageType
from .protocol.onnx_codec import decode_onnx
from .protocol.spaces import Space, from_gymnasium, space_from_json
from .server_link import ServerLink, TetherConnectionError  # noqa: F401  (re-exported)


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
        self._seed = seed
        self._user_obs_space: Space | None = from_gymnasium(observation_space) if observation_space is not None else None
        self._user_action_space: Space | None = from_gymnasium(action_space) if action_space is not None else None
        self._episodes: dict[str, EpisodeRecorder] = {}
        self._finished: list[EpisodeRecorder] = []
        self._pending_steps = 0
        self.policy: OnnxPolicy | None = None
        self.weights_seq_no: int | None = None
        self.observation_space: Space | None = None
        self.action_space: Space | None = None
        #: Env steps delivered to the server.
        self.env_steps_sent = 0
        self.link = ServerLink(host, port, client_name, auth_token, reconnect_timeout_s, self._on_connected, verbose)
        self.link.connect()

    # -- connection ------------------------------------------------------------

    @property
    def server_config(self) -> dict[str, Any]:
        return self.link.server_config

    @property
    def server_info(self) -> dict[str, Any]:
        return self.link.server_info

    @property
    def env_steps_per_sample(self) -> int:
        return self.link.env_steps_per_sample

    @property
    def force_on_policy(self) -> bool:
        return self.link.force_on_policy

    @property
    def reconnects(self) -> int:
        return self.link.reconnects

    def _on_connected(self) -> None:
        config = self.link.server_config
        self.observation_space = (
            space_from_json(config["observation_space"]) if "observation_space" in config else self._user_obs_space
        )
        self.action_space = space_from_json(config["action_space"]) if "action_space" in config else self._user_action_space
        self._apply_state(self.link.request_now({"type": MessageType.GET_STATE.value}))

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
        return to_env_action(self.policy.action_space, action)

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
            self._apply_state(self.link.request(message))
            self.env_steps_sent += steps
        else:
            message = {"type": MessageType.EPISODES.value, "episodes": records, "env_steps": steps,
                       "weights_seq_no": self.weights_seq_no}
            self.link.send(message)
            self.refresh_weights()
            self.env_steps_sent += steps

    def refresh_weights(self) -> None:
        """Ask for the current weights (GET_STATE); the model is swapped if it changed.

        Raises ``ServerError`` for a refused earlier EPISODES message (after the
        weights were applied).
        """
        self._apply_state(self.link.request({"type": MessageType.GET_STATE.value, "weights_seq_no": self.weights_seq_no}))
        self.link.raise_deferred()

    def flush(self) -> None:
        """Send whatever experience is complete now, without waiting for a full sample."""
        self._exchange()

    def close(self) -> None:
        """Close the connection (unsent experience is dropped)."""
        self.link.close()

    def __enter__(self) -> "TetherClient":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
