"""tests/conformance/cuts.json against the Python SDK's clients (§13.3, where a batch is cut): each
case's engine calls played by a TetherClient or a MultiAgentClient of a scripted server, then a
flush; the batches the server received, read back as the vectors write them, are the case's. A case
with "reconnect" loses the first connection at batch 1; later ones describe other observation bounds
("bounds_changed", §6.5: the steps not cut are let go) or the same config."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tether.sdk import MultiAgentClient, TetherClient

from .scripted_server import ScriptedServer, answering_server, constant_model, single_agent_config, state

CASES = json.loads((Path(__file__).resolve().parents[1] / "conformance" / "cuts.json").read_text())["cases"]
WIDTH = 3  # (any width: every element of an observation is the case's value)
DISCRETE2 = {"type": "Discrete", "n": 2}
BOX = {"type": "Box", "shape": [WIDTH], "low": -10.0, "high": 10.0}
MODEL = constant_model(WIDTH, [0.0, 0.0])


def cut_server(case: dict[str, Any]) -> ScriptedServer:
    """A server of the case's steps per batch (env_steps_per_sample) that answers every batch with the
    weights it has (every connection's handshake sends the model), its n-th SET_STATE (0: the handshake's)
    with the case's record_shares[n] (the last one repeated). With "reconnect" the first connection closes
    at its first batch, unanswered, and later connections describe observations in [-9, 9] when it is
    "bounds_changed"."""
    kind, steps, reconnect = case["kind"], case["steps_per_batch"], case.get("reconnect")
    shares = case.get("record_shares")

    def share(n: int) -> dict[str, Any]:
        return {} if shares is None else {"record_share": shares[min(n, len(shares) - 1)]}

    def config(connection: int) -> dict[str, Any]:
        bound = 9.0 if reconnect == "bounds_changed" and connection > 0 else 10.0
        box = {"type": "Box", "shape": [WIDTH], "low": -bound, "high": bound}
        if kind == "single":
            return {**single_agent_config(WIDTH, DISCRETE2, env_steps_per_sample=steps), "observation_space": box}
        names = {"onnx_input_names": ["obs"], "onnx_output_names": ["action_dist_inputs"]}
        return {"type": "SET_CONFIG", "env_steps_per_sample": steps, "force_on_policy": True,
                "modules": {"m": {"observation_space": box, "action_space": DISCRETE2, **names}},
                "policy_mapping": [{"pattern": "*", "module": "m"}]}

    def answer(connection: int, n: int) -> dict[str, Any]:
        if kind == "single":
            return {**state(0, MODEL if n == 0 else None), **share(n)}
        models = {"m": {"weights_seq_no": 0, "onnx_file": state(0, MODEL)["onnx_file"]}}
        return {"type": "SET_STATE", "models": models if n == 0 else {}, **share(n)}

    return answering_server(config, answer, lambda i: "1.3", drop_first_batch=reconnect is not None)


def obs(v: float) -> np.ndarray:
    return np.full(WIDTH, v, np.float32)


def play(client: Any, kind: str, calls: list[list]) -> None:
    started: set[str] = set()
    for what, episode, *args in calls:
        if episode not in started:
            started.add(episode)
            client.start_episode(episode, training_enabled=args[0] if what == "start" else True)
        if what == "start":
            continue
        if kind == "single":
            if what == "act":
                client.get_action(episode, obs(args[0]))
            elif what == "reward":
                client.log_returns(episode, args[0])
            else:
                client.end_episode(episode, obs(args[0]), truncated=what == "truncate")
        elif what == "frame":
            client.get_action(episode, {agent: obs(v) for agent, v in args[0].items()})
        elif what == "reward":
            client.log_returns(episode, {args[0]: args[1]})
        elif what in ("end_agents", "truncate_agents"):
            client.end_agents(episode, {agent: obs(v) for agent, v in args[0].items()}, truncated=what == "truncate_agents")
        else:
            client.end_episode(episode, {agent: obs(v) for agent, v in args[0].items()}, truncated=what == "truncate")


def markers(rows: list[list[float]]) -> list[float]:
    """The value of each observation row (every element the same, or the row is not the case's)."""
    assert all(len(set(row)) == 1 and len(row) == WIDTH for row in rows), rows
    return [row[0] for row in rows]


def flags(part: dict[str, Any], default: bool | None = None) -> dict[str, bool]:
    """A record's or an entry's end flags, booleans (`default`: the value of an optional one left out)."""
    out = {}
    for name in ("is_terminated", "is_truncated"):
        value = part[name] if default is None else part.get(name, default)
        assert type(value) is bool, (name, part)
        out[name] = value
    return out


def steps_of(entry: dict[str, Any]) -> dict[str, Any]:
    assert len(entry["actions"]) == len(entry["rewards"]) == len(entry["obs"]) - 1 >= 1, entry
    return {"obs": markers(entry["obs"]), "rewards": entry["rewards"]}


def as_vectors_write(kind: str, batch: dict[str, Any]) -> dict[str, Any]:
    """A batch as cuts.json writes it: episode id -> record (a single-agent record's flags are required,
    a multi-agent record's default to false; an entry's start_step is an integer)."""
    out = {}
    for record in batch["episodes"]:
        assert record["episode_id"] not in out, f"two records of {record['episode_id']} in one batch"
        if kind == "single":
            out[record["episode_id"]] = {**steps_of(record), **flags(record)}
            continue
        agents = {}
        for agent, entry in record["agents"].items():
            assert type(entry["start_step"]) is int, entry
            agents[agent] = {"start_step": entry["start_step"], **steps_of(entry), **flags(entry)}
        out[record["episode_id"]] = {**flags(record, default=False), "agents": agents}
    return out


@pytest.mark.parametrize("case", CASES, ids=lambda c: c["name"])
def test_batches_are_cut_where_the_vectors_say(case: dict) -> None:
    reconnect = case.get("reconnect")
    with cut_server(case) as server:
        make = TetherClient if case["kind"] == "single" else MultiAgentClient
        # (every batch delivered; with "wait_for_weights", the call that cut a batch waits for its answer)
        client = make("127.0.0.1", server.port, seed=1, when_queue_full="wait", wait_for_weights=case["wait_for_weights"])
        try:
            play(client, case["kind"], case["calls"])
            client.flush()
        finally:
            client.close()
        received = server.messages("EPISODES_AND_GET_STATE")
    assert not server.errors, server.errors
    batches = [b for i, b in enumerate(received) if i == 0 or b["batch_seq"] != received[i - 1]["batch_seq"]]
    resent = len(received) - len(batches)
    assert resent == (1 if reconnect else 0), [b["batch_seq"] for b in received]
    assert not reconnect or received[0] == received[1], "batch 1 was not sent again unchanged"
    assert [b["batch_seq"] for b in batches] == list(range(1, len(batches) + 1)), "a batch skipped"
    assert [as_vectors_write(case["kind"], b) for b in batches] == case["batches"]
