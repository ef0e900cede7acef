"""Per-agent state is bounded and freed: one client's records with many
distinct agent ids leave nothing behind once it disconnects (or, for a
client_session, once the session expires)."""

from __future__ import annotations

import asyncio
import gc
import tracemalloc

from tether.protocol import FrameDecoder, encode_frame
from tether.server.config import ServerConfig
from tether.server.module_setup import build_layout
from tether.server.transport.tcp import TetherServer
from tether.server.trainer import Trainer

AGENTS = 8_000


def entry(done: bool) -> dict:
    return {"module": "default_policy", "obs": [[0.0, 0.0, 0.0, 0.0]] * 2, "actions": [1], "rewards": [1.0],
            "is_terminated": done, "is_truncated": False}


def message(session: str | None) -> dict:
    half = AGENTS // 2
    ongoing = {f"u{i:x}z": entry(done=i < half) for i in range(AGENTS)}  # ids that name no common type
    finished = {f"w{i:x}z": entry(done=True) for i in range(AGENTS)}
    msg = {"type": "EPISODES_AND_GET_STATE", "episodes": [
        {"episode_id": "ongoing", "is_terminated": False, "is_truncated": False, "agents": ongoing},
        {"episode_id": "finished", "is_terminated": True, "is_truncated": False, "agents": finished}]}
    if session:
        msg.update(client_session=session, batch_seq=1)
    return msg


def held(trainer: Trainer) -> tuple[int, int]:
    return trainer.ingest.open_state_size(), trainer.episodes.open_size()


async def run(tmp_path, session: str | None) -> dict:
    config = ServerConfig(port=0, force_on_policy=False, policies_to_train=[], tensorboard=False, quiet=True,
                          logdir=str(tmp_path), session_state_ttl_s=0.3)
    trainer = Trainer(config, build_layout(config))
    server = TetherServer(trainer)
    await server.start()
    frame = encode_frame(message(session))
    # Start the large-body decoding worker first: its executor's own buffers are not per-agent state.
    await asyncio.get_running_loop().run_in_executor(server.service.decode_pool._executor(), int, 0)
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(frame)
    decoder, bodies = FrameDecoder(), []
    while not bodies:
        bodies = decoder.feed(await reader.read(1 << 20))
    while_connected = held(trainer)
    writer.close()
    await writer.wait_closed()
    await asyncio.sleep(0.1)
    after_close = held(trainer)
    await asyncio.sleep(0.5)
    del frame, bodies, decoder
    # The worker's call queue keeps the last pickled job (one body, not per-agent
    # state) until the next one: send a tiny job so only per-agent state is measured.
    await asyncio.get_running_loop().run_in_executor(server.service.decode_pool._executor(), int, 0)
    gc.collect()
    retained = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    await server.stop()
    await trainer.close(checkpoint=False)
    return {"while": while_connected, "after_close": after_close, "end": held(trainer), "retained": retained,
            "types": len(trainer.metrics.agent_type_returns), "episodes": trainer.metrics.episodes_total}


def test_per_agent_state_is_freed_when_the_connection_closes(tmp_path) -> None:
    out = asyncio.run(run(tmp_path, session=None))
    assert out["episodes"] == 1 and out["while"][0] >= AGENTS // 2 and out["while"][1] >= AGENTS // 2
    assert out["after_close"] == (0, 0)
    assert out["types"] <= 65  # agent-type metrics are capped; ids are chosen by clients
    assert out["retained"] < 1 << 20, out


def test_client_session_state_waits_for_a_reconnect_then_expires(tmp_path) -> None:
    out = asyncio.run(run(tmp_path, session="s-1"))
    assert out["after_close"][0] >= AGENTS // 2  # kept for a reconnect within session_state_ttl_s
    assert out["end"] == (0, 0)
    assert out["retained"] < 1 << 20, out
