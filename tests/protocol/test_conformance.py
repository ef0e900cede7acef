"""Runs the shared conformance vectors (tests/conformance/*.json) through the
Python protocol core and, for the rules that live in the server (server-session
vectors), through a real Tether server started in this process. The files are
plain JSON so that SDKs in other languages can run them too."""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tether.protocol import (
    ClientConnection,
    FrameDecoder,
    RemoteProtocolError,
    encode_frame,
    to_env_action,
    FramingError,
    MessageError,
    Refusal,
    ServerConnection,
    decode_episodes,
    decode_message,
    dist_inputs_size,
    log_prob,
    space_from_json,
)

from tether.protocol.messages import EXPECTED_RESPONSE
from tether.protocol.tensors import ATTACHMENT, TENSOR_DTYPES, TensorError, decode_tensor, encode_tensor
from tether.protocol.multi_agent import GroupSpec, ModuleSpec, decode_multi_agent_record, group_spaces, value_obs_row
from tether.protocol.policy_mapping import PolicyMapping, fnv1a32, read_agent_modules

VECTORS = Path(__file__).resolve().parents[1] / "conformance"


def cases(name: str) -> list[dict]:
    data = json.loads((VECTORS / name).read_text())
    return data["cases"]


def ids(items: list[dict]) -> list[str]:
    return [c["name"] for c in items]


def feed_all(decoder: FrameDecoder, data: bytes, step: int) -> list[bytes]:
    """Feed in pieces of ``step`` bytes until the decoder fails or data ends."""
    bodies: list[bytes] = []
    for i in range(0, len(data), step):
        try:
            bodies += decoder.feed(data[i : i + step])
        except FramingError:
            break
        if decoder.error is not None:
            break
    return bodies


@pytest.mark.parametrize("step", [1, 7, 1 << 20], ids=["byte_by_byte", "7_bytes", "whole"])
@pytest.mark.parametrize("case", cases("framing.json"), ids=ids(cases("framing.json")))
def test_framing_vector(case: dict, step: int) -> None:
    decoder = FrameDecoder(case.get("max_frame_bytes", 64 * 1024 * 1024))
    bodies = feed_all(decoder, bytes.fromhex(case["input_hex"]), step)
    if "error" in case:
        # Frames complete before the bad header are still delivered, then the error holds.
        assert [b.decode() for b in bodies] == case.get("bodies_before_error", [])
        assert decoder.error is not None and decoder.error.code.value == case["error"]
        with pytest.raises(FramingError):
            decoder.feed(b"00000002{}")  # a failed decoder stays failed
    else:
        assert decoder.error is None
        assert [b.decode() for b in bodies] == case["bodies"]


@pytest.mark.parametrize("case", cases("messages.json"), ids=ids(cases("messages.json")))
def test_message_vector(case: dict) -> None:
    body = bytes.fromhex(case["body_hex"])
    if "error" in case:
        with pytest.raises(MessageError) as info:
            decode_message(body)
        assert info.value.code.value == case["error"]
    else:
        kind, message = decode_message(body)
        assert kind.value == case["type"] == message["type"]


def space_or_refusal(case: dict):
    """The space of a space vector, or None after checking that it is refused with the vector's error."""
    if "error" in case:
        with pytest.raises(MessageError) as info:
            space_from_json(case["space"])
        assert info.value.code.value == case["error"]
        return None
    return space_from_json(case["space"])


@pytest.mark.parametrize("case", cases("spaces.json"), ids=ids(cases("spaces.json")))
def test_space_vector(case: dict) -> None:
    space = space_or_refusal(case)
    if space is None:
        return
    assert list(space.shape) == case["shape"]
    assert dist_inputs_size(space) == case["dist_inputs_size"]
    # The canonical JSON a peer writes back parses to the same space.
    again = space_from_json(json.loads(json.dumps(space.to_json())))
    assert again.to_json() == space.to_json()


@pytest.mark.parametrize("case", cases("tensors.json"), ids=ids(cases("tensors.json")))
def test_tensor_vector(case: dict) -> None:
    tensor = dict(case["tensor"])
    if "attachment_hex" in case:
        tensor[ATTACHMENT] = memoryview(bytes.fromhex(case["attachment_hex"]))
    if "error" in case:
        with pytest.raises(TensorError):
            decode_tensor(tensor)
        return
    array = decode_tensor(tensor)
    assert array.dtype == TENSOR_DTYPES[case["dtype"]] and list(array.shape) == case["shape"]
    assert array.ravel().tolist() == case["values"]
    if "b64" in case["tensor"]:  # what the core writes inline reads back the same, byte for byte
        assert encode_tensor(array) == case["tensor"]


@pytest.mark.parametrize("case", cases("episodes.json"), ids=ids(cases("episodes.json")))
def test_episode_vector(case: dict) -> None:
    obs_space = space_from_json(case["observation_space"])
    act_space = space_from_json(case["action_space"])
    try:
        _, message = decode_message(case["body"].encode())
        chunks = decode_episodes(message, obs_space, act_space, case["require_logp"])
    except MessageError as exc:
        assert "error" in case, f"unexpected {exc}"
        assert exc.code.value == case["error"]
        return
    assert "error" not in case, f"expected {case.get('error')}"
    assert sum(c.env_steps for c in chunks) == case["env_steps"]
    for c in chunks:
        assert c.obs.shape[0] == c.env_steps + 1


@pytest.mark.parametrize("case", cases("logp.json"), ids=ids(cases("logp.json")))
def test_logp_vector(case: dict) -> None:
    space = space_from_json(case["space"])
    got = log_prob(space, np.asarray(case["dist_inputs"]), case["action"])
    assert math.isclose(got, case["logp"], rel_tol=1e-9, abs_tol=1e-9)
    if "env_action" in case:  # 1.3: the record keeps the raw sample, the engine gets it clipped
        np.testing.assert_allclose(to_env_action(space, np.asarray(case["action"])), case["env_action"], rtol=1e-6)


@pytest.mark.parametrize("case", cases("session.json"), ids=ids(cases("session.json")))
def test_session_vector(case: dict) -> None:
    conn = ServerConnection(auth_token=case["server"].get("auth_token"))
    got = []
    for request in case["requests"]:
        (event,) = conn.receive_data(b"%08d" % len(json.dumps(request)) + json.dumps(request).encode())
        if isinstance(event, Refusal):
            got.append(f"ERROR:{event.error.code.value}")
        else:
            got.append(EXPECTED_RESPONSE[event.kind].value)
    assert got == case["responses"]


MAPPING = json.loads((VECTORS / "policy_mapping.json").read_text())


@pytest.mark.parametrize("case", MAPPING["cases"], ids=ids(MAPPING["cases"]))
def test_policy_mapping_vector(case: dict) -> None:
    if "fnv1a32" in case:
        assert fnv1a32(bytes.fromhex(case["fnv1a32_of_hex"])) == case["fnv1a32"]
        return
    mapping = PolicyMapping.from_json(MAPPING["rules"])
    if "error" in case:
        with pytest.raises(MessageError) as info:
            mapping.module_for(case["agent_id"], case["episode_id"])
        assert info.value.code.value == case["error"]
    else:
        assert mapping.module_for(case["agent_id"], case["episode_id"]) == case["module"]


@pytest.mark.parametrize("case", cases("agent_modules.json"), ids=ids(cases("agent_modules.json")))
def test_agent_modules_answer_vector(case: dict) -> None:
    if "error" in case:
        with pytest.raises(MessageError) as info:
            read_agent_modules(case["answer"], case["asked"], set(case["described"]))
        assert info.value.code.value == case["error"]
    else:
        assert read_agent_modules(case["answer"], case["asked"], set(case["described"])) == case["modules"]


@pytest.mark.parametrize("case", cases("multi_agent_episodes.json"), ids=ids(cases("multi_agent_episodes.json")))
def test_multi_agent_episode_vector(case: dict) -> None:
    modules = {m: ModuleSpec.from_json(m, spec) for m, spec in case["modules"].items()}
    raw = json.loads(case["record_json"]) if "record_json" in case else case["record"]
    try:
        record = decode_multi_agent_record(raw, 0, modules, case["require_logp"])
    except MessageError as exc:
        assert "error" in case, f"unexpected {exc}"
        assert exc.code.value == case["error"]
        return
    assert "error" not in case, f"expected {case.get('error')}"
    assert record.agent_steps == case["agent_steps"]


# -- server sessions: a real server in this process, one TCP connection at a time ------------------


class _Peer:
    """A raw RLlink connection: frames out, decoded answers in."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer, self.decoder = reader, writer, FrameDecoder()
        self.ready: list[bytes] = []

    @classmethod
    async def open(cls, port: int) -> "_Peer":
        return cls(*await asyncio.open_connection("127.0.0.1", port))

    async def send(self, message: dict) -> None:
        self.writer.write(encode_frame(message))
        await self.writer.drain()

    async def send_raw(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def read(self, within_s: float = 10) -> dict:
        while not self.ready:
            data = await asyncio.wait_for(self.reader.read(1 << 20), within_s)
            assert data, "the server closed the connection"
            self.ready += self.decoder.feed(data)
        return decode_message(self.ready.pop(0))[1]

    async def closed_by_server(self, within_s: float = 5) -> bool:
        """Whether the server closes the connection (end of stream, nothing more) within ``within_s``."""
        try:
            data = await asyncio.wait_for(self.reader.read(1 << 20), within_s)
        except (asyncio.TimeoutError, ConnectionError):
            return False
        return not data and not self.ready

    async def close(self) -> None:
        self.writer.close()
        await self.writer.wait_closed()


def _member(message: dict, path: str) -> tuple[bool, Any]:
    value: Any = message
    for key in path.split("."):
        if not isinstance(value, dict) or key not in value:
            return False, None
        value = value[key]
    return True, value


def _short(message: dict) -> str:
    """A message for an assertion text, models abbreviated."""
    text = json.dumps(message)
    return text if len(text) < 400 else text[:400] + "…"


def _check_answer(answer: dict, step: dict, where: str) -> None:
    expect = step["expect"]
    got = f"ERROR:{answer.get('code')}" if answer["type"] == "ERROR" else answer["type"]
    assert got == expect, f"{where}: expected {expect}, got {_short(answer)}"
    for key, value in step.get("fields", {}).items():
        assert answer.get(key) == value, f"{where}: {key} is {answer.get(key)!r}, expected {value!r}"
    for path in step.get("present", []):
        assert _member(answer, path)[0], f"{where}: {path} missing from {_short(answer)}"
    for path in step.get("absent", []):
        assert not _member(answer, path)[0], f"{where}: {path} must be absent"


def _received_agent_steps(trainer: Any) -> int:
    metrics = trainer.metrics
    return int(getattr(metrics, "agent_steps_received", metrics.env_steps_received))


def _received_env_steps(trainer: Any) -> int:
    return int(trainer.metrics.env_steps_received)


async def _answer_step(peer: "_Peer", step: dict, where: str) -> dict | None:
    """One step that sends something (a message or raw bytes) or waits for an unsolicited frame;
    returns the answer, if any."""
    answer: dict | None = None
    if "wait_unsolicited" in step:
        answer = await peer.read(within_s=step["within_s"])
        _check_answer(answer, {**step, "expect": step["wait_unsolicited"]}, where)
    else:
        if "send_hex" in step:
            await peer.send_raw(bytes.fromhex(step["send_hex"]))
        else:
            await peer.send(step["send"])
        if step["expect"] is None:  # no answer: a PING sent next is answered first
            await peer.send({"type": "PING"})
            answer = await peer.read()
            assert answer["type"] == "PONG", f"{where}: expected no answer, got {_short(answer)}"
        else:
            answer = await peer.read()
            _check_answer(answer, step, where)
    if step.get("then_closed"):
        assert await peer.closed_by_server(), f"{where}: the server did not close the connection"
    return answer


async def _run_server_session(case: dict, logdir: Path) -> None:
    from tether.server.config import ServerConfig
    from tether.server.module_setup import build_layout
    from tether.server.transport.tcp import TetherServer
    from tether.server.trainer import Trainer

    # No update may run during a case: the batch size is out of reach.
    options = {"env": None, "port": 0, "logdir": str(logdir), "tensorboard": False, "quiet": True,
               "checkpoint_every": 0, "device": "cpu", "train_batch_size": 10**9, **case["server"]}
    config = ServerConfig.from_dict(options)
    trainer = Trainer(config, build_layout(config))
    server = TetherServer(trainer)
    await server.start()
    try:
        peer = await _Peer.open(server.port)
        answers: dict[int, dict | None] = {}
        for i, step in enumerate(case["steps"]):
            where = f"step {i}"
            if step.get("reconnect"):
                await peer.close()
                peer = await _Peer.open(server.port)
                continue
            if "extra_connection" in step:
                extra = await _Peer.open(server.port)
                await _answer_step(extra, step["extra_connection"], where + " (extra connection)")
                await extra.close()
                continue
            answers[i] = await _answer_step(peer, step, where)
            if "same_answer_as" in step:
                assert answers[i] == answers[step["same_answer_as"]], f"{where}: answered differently"
        await peer.close()
        if "received_agent_steps" in case:
            assert _received_agent_steps(trainer) == case["received_agent_steps"], "agent steps received"
        if "received_env_steps" in case:
            assert _received_env_steps(trainer) == case["received_env_steps"], "env steps received"
    finally:
        await server.stop()
        await trainer.close(checkpoint=False)


SERVER_SESSION_FILES = ["map_agents.json", "multi_agent_sessions.json", "exactly_once.json", "set_state.json",
                        "connection.json", "counting.json"]
SERVER_SESSIONS = [(f, c) for f in SERVER_SESSION_FILES for c in cases(f)]


@pytest.mark.parametrize("case", [c for _, c in SERVER_SESSIONS],
                         ids=[f"{f.removesuffix('.json')}:{c['name']}" for f, c in SERVER_SESSIONS])
def test_server_session_vector(case: dict, tmp_path: Path) -> None:
    asyncio.run(_run_server_session(case, tmp_path))


# -- client-side transforms ------------------------------------------------------------------------


@pytest.mark.parametrize("case", cases("groups.json"), ids=ids(cases("groups.json")))
def test_group_vector(case: dict) -> None:
    if "member_action_spaces" in case:
        obs_spaces = [space_from_json(s) for s in case["member_observation_spaces"]]
        act_spaces = [space_from_json(s) for s in case["member_action_spaces"]]
        if "error" in case:
            with pytest.raises(ValueError):
                group_spaces(obs_spaces, act_spaces)
            return
        obs, act = group_spaces(obs_spaces, act_spaces)
        assert obs.to_json() == space_from_json(case["group_observation_space"]).to_json()
        assert act.to_json() == space_from_json(case["group_action_space"]).to_json()
        return
    group = GroupSpec.from_json("g", case["group"])
    if "member_observations" in case:
        if "error" in case:
            with pytest.raises(ValueError):
                group.join_observations(case["member_observations"])
            return
        assert group.join_observations(case["member_observations"]).tolist() == case["group_observation"]
    elif "group_action" in case:
        space = space_from_json(case["group_action_space"])
        parts = group.split_action(np.asarray(case["group_action"]), discrete=not hasattr(space, "low"))
        got = {m: p.tolist() if isinstance(p, np.ndarray) else p for m, p in parts.items()}
        assert got == case["member_actions"]
        for m, expected in case["member_actions"].items():  # a bare integer stays bare, an array stays an array
            assert isinstance(parts[m], np.ndarray) == isinstance(expected, list)
    else:
        received = [r for step in case["member_rewards"] for r in step.values()]
        assert group.combine_rewards(received) == pytest.approx(case["group_reward"])


@pytest.mark.parametrize("case", cases("value_obs.json"), ids=ids(cases("value_obs.json")))
def test_value_obs_vector(case: dict) -> None:
    latest: dict[str, Any] = {}
    for step in case["steps"]:
        latest.update(step.get("observe", {}))
        latest.update(step.get("leave", {}))
        row = value_obs_row(case["value_obs_agents"], latest, case["obs_dim"])
        assert row.tolist() == step["row"]


@pytest.mark.parametrize("case", cases("client_pairing.json"), ids=ids(cases("client_pairing.json")))
def test_client_pairing_vector(case: dict) -> None:
    conn = ClientConnection()
    for kind in case["sent"]:
        conn.send({"type": kind})
    data = b"".join(encode_frame(body) for body in case["received"])
    if case.get("violation"):
        with pytest.raises(RemoteProtocolError):
            conn.receive_data(data)
        return
    pairs = conn.receive_data(data)
    assert [None if request is None else request.value for request, _ in pairs] == case["pairs"]


@pytest.mark.parametrize("case", cases("run_ids.json"), ids=ids(cases("run_ids.json")))
def test_run_ids_vector(case: dict) -> None:
    """**[1.8]** Steps acted under one run are sent on a connection to another only when either names none."""
    from tether.protocol.connection import from_another_run, run_id_of

    acted_in, connected_to = run_id_of({"run_id": case["acted_in"]}), run_id_of({"run_id": case["connected_to"]})
    assert (not from_another_run(acted_in, connected_to)) == case["send"]


@pytest.mark.parametrize("case", cases("rank_addresses.json"), ids=ids(cases("rank_addresses.json")))
def test_rank_addresses_vector(case: dict) -> None:
    """**[1.9]** A group's addresses: how one reads, what a PONG's ranks and redirect say, where reconnects go."""
    from tether.protocol.connection import parse_address, rank_addresses, reconnect_order, redirect_of

    def read(text: str) -> tuple[str, int]:
        address = parse_address(text)
        assert address is not None, text
        return address

    if case["kind"] == "parse":
        address = parse_address(case["value"])
        assert (None if address is None else list(address)) == case["address"]
    elif case["kind"] == "pong":
        assert [list(a) for a in rank_addresses(case["pong"])] == case["ranks"]
        follow = redirect_of(case["pong"], read(case["current"]), case["redirected"])
        assert (None if follow is None else list(follow)) == case["follow"]
    else:
        order = reconnect_order(read(case["given"]), [read(r) for r in case["ranks"]], read(case["lost"]))
        attempts = [order[k % len(order)] for k in range(len(case["attempts"]))]
        assert attempts == [read(a) for a in case["attempts"]]


def test_a_body_whose_tensors_read_the_same_bytes_twice_is_refused() -> None:
    """§10.9: a body's tensors refer to at most as many bytes as its attachment holds (else one small
    body could make the server hold its attachment many times over)."""
    from tether.protocol import Discrete, encode_frame
    from tether.protocol.episodes import decode_episodes
    from tether.protocol.framing import FrameDecoder
    from tether.protocol.tensors import encode_tensor_at

    obs = np.arange(12, dtype=np.uint8).reshape(3, 2, 2, 1)
    record = {"obs": encode_tensor_at(obs, 0), "actions": [0, 1], "rewards": [1.0, 0.0], "is_terminated": True,
              "is_truncated": False}
    space = space_from_json({"type": "Box", "shape": [2, 2, 1], "dtype": "uint8", "low": 0, "high": 255})
    for records, refused in (([record], False), ([record, dict(record, episode_id="again")], True)):
        body = FrameDecoder().feed(encode_frame({"type": "EPISODES", "episodes": records}, obs.tobytes()))[0]
        _, message = decode_message(body)
        if refused:
            with pytest.raises(MessageError) as info:
                decode_episodes(message, space, Discrete(2), False)
            assert info.value.code.value == "INVALID_TENSOR" and "episodes[1]" in info.value.message
        else:
            (chunk,) = decode_episodes(message, space, Discrete(2), False)
            assert chunk.obs.base is None or chunk.obs.base.base is not body  # a copy, not a view of the body
            np.testing.assert_array_equal(chunk.obs, obs)


def test_an_empty_tensor_of_huge_dimensions_is_refused_not_an_internal_error() -> None:
    with pytest.raises(TensorError, match="too large"):
        decode_tensor({"dtype": "uint8", "shape": [0, 2**31 - 1, 2**31 - 1, 2**31 - 1], "b64": ""})


@pytest.mark.parametrize("case", cases("offline_policy.json"), ids=ids(cases("offline_policy.json")))
def test_offline_policy_vector(case: dict) -> None:
    """§20: an offline policy file's text gives its three messages, or an error naming what is wrong."""
    from tether.protocol.offline_policy import OfflinePolicyError, parse_offline_policy

    if "messages" in case:
        assert list(parse_offline_policy(case["text"])) == case["messages"]
        return
    with pytest.raises(OfflinePolicyError) as refused:
        parse_offline_policy(case["text"])
    assert refused.value.code == case["code"]
    assert case["names"] in str(refused.value)
