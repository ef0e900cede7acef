"""Offline policy files (§20): a server's ``offline_policy.json`` lets a Python client act with no server.

The file is written by a real Trainer (``save_offline_policy``, as ``tether serve`` does at its end);
the clients made from it act with the trained module's own weights (their action distributions are
the torch model's), in the file's spaces, mapping rules and groups; nothing is recorded or sent,
episodes are written to a demonstration file, and a broken file is refused by name."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from tether.protocol.demonstrations import read_demonstrations
from tether.protocol.errors import NotReadyError, TetherConnectionError
from tether.protocol.offline_policy import OfflinePolicyError
from tether.protocol.onnx_codec import encode_onnx
from tether.sdk import MultiAgentClient, TetherClient
from tether.server.config import ServerConfig
from tether.server.module_setup import build_layout
from tether.server.trainer import Trainer

REPO = Path(__file__).resolve().parents[2]
CARTPOLE = {"observation_space": {"type": "Box", "shape": [4], "low": -5, "high": 5},
            "action_space": {"type": "Discrete", "n": 2}}


def written(tmp_path: Path, mapping_fn=None, **options) -> tuple[Trainer, Path]:
    config = ServerConfig.from_dict({"tensorboard": False, "logdir": str(tmp_path / "run"), "quiet": True,
                                     "checkpoint_every": 0, **options})
    trainer = Trainer(config, build_layout(config, mapping_fn))
    for runtime in trainer.modules.values():  # (weights no fresh network has: the file must carry these)
        with torch.no_grad():
            for p in runtime.learner.model.parameters():
                p.add_(torch.linspace(-0.3, 0.4, p.numel()).reshape(p.shape))
        runtime.weights_seq_no = 6
        runtime.publish(encode_onnx(runtime.learner.export_onnx()))  # served as v7
    return trainer, trainer.save_offline_policy()


def torch_logits(trainer: Trainer, module: str, obs: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return trainer.modules[module].learner.model.dist_inputs(torch.as_tensor(obs[None], dtype=torch.float32))[0].numpy()


def test_a_single_agent_client_acts_with_the_files_weights_records_demonstrations_and_sends_nothing(tmp_path) -> None:
    trainer, path = written(tmp_path, **CARTPOLE)
    assert path == tmp_path / "run" / "offline_policy.json"
    client = TetherClient("127.0.0.1", 1, offline_policy=path, seed=0)  # (port 1: nothing is ever reached)
    try:
        assert client.offline and client.server_address == f"offline:{path}"
        assert client.weights_seq_no == 7 and client.action_space.to_json()["n"] == 2
        obs = np.array([0.1, -0.2, 0.03, 0.4], np.float32)
        np.testing.assert_allclose(client.policy.dist_inputs_one(obs), torch_logits(trainer, "default_policy", obs),
                                   atol=1e-5)
        client.record_demonstrations(tmp_path / "played.jsonl")
        for _ in range(3):
            eid = client.start_episode()
            for t in range(5):
                action = client.get_action(eid, obs * t)
                assert action in (0, 1)
                client.log_returns(eid, 1.0)
            client.log_action(eid, obs, 1)  # (a scripted step beside the policy's)
            client.log_returns(eid, 1.0)
            client.end_episode(eid, obs)
        client.flush()
        client.refresh_weights()  # (the file's models are the newest there are: nothing changes)
        assert client.weights_seq_no == 7
        assert client.agent_steps_sent == 0 and client.episodes_held_back == 0 and client.link.idle()
        played = client.start_episode()
        client.get_action(played, obs)
        client.log_returns(played, 1.0)
        # Neither recorded nor held back: nothing waits to be cut (a recorded episode's step would).
        assert not client._episodes[played].training_enabled and not client._episodes[played].held_back
        assert client._pending_steps == 0
    finally:
        client.close()
    with pytest.raises(TetherConnectionError):
        client.refresh_weights()
    demos = read_demonstrations(tmp_path / "played.jsonl")
    episodes = demos.of_module("default_policy")
    assert len(episodes) == 3 and all(len(e.chunk.actions) == 6 for e in episodes)
    assert [e.chunk.rewards.sum() for e in episodes] == [6.0] * 3


def test_a_multi_agent_client_maps_groups_and_acts_per_module_offline(tmp_path) -> None:
    options = json.loads((REPO / "examples" / "configs" / "cpp_multi_agent.json").read_text())
    options.pop("_comment")
    trainer, path = written(tmp_path, **options)
    client = MultiAgentClient(offline_policy=path, seed=1)
    try:
        client.record_demonstrations(tmp_path / "team.jsonl")
        obs = {"scout_0": np.full(4, 0.2, np.float32), "lift_0": np.full(2, 0.5, np.float32),
               "lift_1": np.full(2, 0.7, np.float32)}
        eid = client.start_episode()
        for _ in range(4):
            actions = client.get_action(eid, obs)
            assert actions["scout_0"] in (0, 1, 2) and actions["lift_0"] in (0, 1) and actions["lift_1"] in (0, 1)
            client.log_returns(eid, {"scout_0": 1.0, "lift_0": 0.5, "lift_1": 0.5})
        client.end_episode(eid, obs)
        assert client.agent_steps_sent == 0 and client.weights_seq_nos == {"scout": 7, "lifter": 7}
        scout = client.policies["scout"].dist_inputs_one(obs["scout_0"])
        np.testing.assert_allclose(scout, torch_logits(trainer, "scout", obs["scout_0"]), atol=1e-5)
    finally:
        client.close()
    played = read_demonstrations(tmp_path / "team.jsonl")
    assert {m: len(played.of_module(m)) for m in ("scout", "lifter")} == {"scout": 1, "lifter": 1}


def test_agents_only_a_server_could_map_are_refused_offline_by_name(tmp_path) -> None:
    """A server that maps with a function (MAP_AGENTS) names no rules: offline, nobody can map."""
    options = json.loads((REPO / "examples" / "configs" / "cpp_multi_agent.json").read_text())
    for key in ("_comment", "policy_mapping", "groups"):
        options.pop(key)
    _, path = written(tmp_path, mapping_fn=lambda agent_id, episode_id: "scout", **options)
    client = MultiAgentClient(offline_policy=path)
    try:
        eid = client.start_episode()
        with pytest.raises(NotReadyError, match="MAP_AGENTS: an offline client has no server to ask"):
            client.get_action(eid, {"scout_0": np.zeros(4, np.float32)})
    finally:
        client.close()


OTHER_MAJOR = json.dumps({"format": "tether-offline-policy", "version": 1, "pong": {"type": "PONG", "protocol_version": "2.0"},
                          "config": {"type": "SET_CONFIG"}, "state": {"type": "SET_STATE", "onnx_file": ""}})


@pytest.mark.parametrize("text, code, names", [
    (None, "INVALID_ARGUMENT", "cannot be read"),
    ("{\"format\": ", "INVALID_JSON", "not JSON"),
    (json.dumps({"format": "tether-offline-policy", "version": 2}), "INVALID_FIELD", "version"),
    (json.dumps({"format": "tether-demonstrations", "version": 1}), "INVALID_FIELD", "format"),
    (OTHER_MAJOR, "VERSION_MISMATCH", "2.0"),
])
def test_a_broken_offline_policy_file_is_refused_naming_the_file_and_the_fault(tmp_path, text, code, names) -> None:
    path = tmp_path / "offline_policy.json"
    if text is not None:
        path.write_text(text)
    with pytest.raises(OfflinePolicyError) as refused:
        TetherClient(offline_policy=path)
    assert refused.value.code == code and names in str(refused.value) and str(path) in str(refused.value)


def test_a_file_whose_model_is_corrupt_is_refused_like_a_servers(tmp_path) -> None:
    _, path = written(tmp_path, **CARTPOLE)
    body = json.loads(path.read_text())
    body["state"]["onnx_file"] = "bm90IGEgbW9kZWw="  # base64 of "not a model"
    path.write_text(json.dumps(body))
    with pytest.raises(OfflinePolicyError) as refused:
        TetherClient(offline_policy=path)
    assert str(path) in str(refused.value) and "onnx_file" in str(refused.value), refused.value


def test_a_single_agent_client_is_refused_a_file_without_a_default_module(tmp_path) -> None:
    """A server with several modules has no default one: its file holds no single-agent model (§20)."""
    options = json.loads((REPO / "examples" / "configs" / "cpp_multi_agent.json").read_text())
    options.pop("_comment")
    _, path = written(tmp_path, **options)
    with pytest.raises(OfflinePolicyError, match="no default module") as refused:
        TetherClient(offline_policy=path)
    assert refused.value.code == "INVALID_FIELD" and str(path) in str(refused.value)
