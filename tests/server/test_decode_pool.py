"""Large bodies are decoded in a worker process; the result must be exactly
what inline decoding gives: the same records, the same first error."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tether.sdk.protocol.errors import MessageError
from tether.sdk.protocol.messages import decode_message
from tether.server import decode_pool
from tether.server.config import ServerConfig
from tether.server.ingest import EpisodeIngest
from tether.server.module_setup import build_layout

GOOD = {
    "obs": [[0.0, 0.1, 0.0, -0.1], [0.01, 0.2, 0.0, -0.2], [0.02, 0.3, 0.01, -0.3]],
    "actions": [0, 1], "rewards": [1.0, 1.0], "action_logp": [-0.7, -0.69],
    "is_terminated": True, "is_truncated": False,
}
MULTI = {"episode_id": "m", "is_terminated": True, "is_truncated": False,
         "agents": {"default_agent": dict(GOOD, module="default_policy", start_step=0)}}


def body(*records, kind="EPISODES_AND_GET_STATE", **extra) -> bytes:
    return json.dumps({"type": kind, "episodes": list(records), **extra}).encode()


CASES = {
    "valid": body(GOOD, dict(GOOD, episode_id="b"), MULTI, weights_seq_no=3),
    "bad_third_record": body(GOOD, GOOD, dict(GOOD, rewards=[1.0]), dict(GOOD, obs="x")),
    "state_error_before_shape_error": body(MULTI, MULTI, dict(GOOD, rewards=[1.0])),
    "episodes_not_a_list": body(kind="EPISODES") .replace(b"[]", b"7"),
    "invalid_json": b'{"type": "EPISODES", "episodes": [',
    "other_type": json.dumps({"type": "PING", "protocol_version": "1.3", "junk": [1] * 10}).encode(),
}


def outcome(ingest: EpisodeIngest, message: dict, predecoded=None):
    try:
        records = ingest.decode(1, message, predecoded=predecoded)
    except MessageError as exc:
        return ("error", exc.code, exc.message)
    return [(r.episode_id, [(a.agent_id, a.module_id, a.chunk.obs.tobytes(), a.chunk.actions.tobytes(),
                             a.chunk.rewards.tobytes()) for a in r.agents]) for r in records]


@pytest.mark.parametrize("name", list(CASES))
def test_worker_decoding_matches_inline(name: str) -> None:
    layout = build_layout(ServerConfig(), None)
    data = CASES[name]
    decode_pool._init_worker(layout.specs, layout.default_module(), True)
    done = decode_pool._decode_in_worker(data)
    try:
        kind, message = decode_message(data)
    except MessageError as exc:
        assert done == ("error", exc.code.value, exc.message, None)
        return
    assert done[0] == "ok" and done[1] == kind.value
    if kind.value not in ("EPISODES", "EPISODES_AND_GET_STATE"):
        assert "junk" not in done[2] and done[2]["protocol_version"] == "1.3"
        return
    inline = outcome(EpisodeIngest(layout, True), message)
    worker = outcome(EpisodeIngest(layout, True), done[2], done[3])
    assert worker == inline
    if name == "valid":
        assert done[2]["weights_seq_no"] == 3 and len(inline) == 3
    # The worker stops at the first bad record: later ones are never decoded.
    if name == "bad_third_record":
        assert len(done[3]) == 3 and isinstance(done[3][2], MessageError)


def test_state_checks_still_run_on_predecoded_records() -> None:
    """A multi-agent agent that already finished cannot act again, however it was decoded."""
    layout = build_layout(ServerConfig(), None)
    decode_pool._init_worker(layout.specs, layout.default_module(), True)
    open_ep = dict(MULTI, is_terminated=False)
    open_ep["agents"] = {"default_agent": dict(GOOD, module="default_policy", start_step=0, is_terminated=True)}
    data = body(open_ep, open_ep)
    done = decode_pool._decode_in_worker(data)
    result = outcome(EpisodeIngest(layout, True), done[2], done[3])
    assert result[0] == "error" and result[1].value == "AGENT_ALREADY_DONE"
    assert np.isfinite(done[3][0][1].agents[0].chunk.obs).all()
