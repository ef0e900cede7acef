"""Large bodies are decoded in a worker process; the result must be exactly
what inline decoding gives: the same records, the same first error."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from tether.protocol.errors import MessageError
from tether.protocol.messages import decode_message
from tether.server.ingest import decode_pool
from tether.server.config import ServerConfig
from tether.server.ingest.validation import EpisodeIngest
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
        pending = ingest.validate(1, message, predecoded=predecoded)  # (as the pipeline does, without the logp check)
        pending.commit()
        records = pending.records
    except MessageError as exc:
        return ("error", exc.code, exc.message)
    return [(r.episode_id, [(a.agent_id, a.module_id, a.chunk.obs.tobytes(), a.chunk.actions.tobytes(),
                             a.chunk.rewards.tobytes()) for a in r.agents]) for r in records]


@pytest.mark.parametrize("name", list(CASES))
def test_worker_decoding_matches_inline(name: str) -> None:
    layout = build_layout(ServerConfig(), None)
    data = CASES[name]
    decode_pool._init_worker(os.getppid(), layout.specs, layout.default_module(), True)
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
    decode_pool._init_worker(os.getppid(), layout.specs, layout.default_module(), True)
    open_ep = dict(MULTI, is_terminated=False)
    open_ep["agents"] = {"default_agent": dict(GOOD, module="default_policy", start_step=0, is_terminated=True)}
    data = body(open_ep, open_ep)
    done = decode_pool._decode_in_worker(data)
    result = outcome(EpisodeIngest(layout, True), done[2], done[3])
    assert result[0] == "error" and result[1].value == "AGENT_ALREADY_DONE"
    assert np.isfinite(done[3][0][1].agents[0].chunk.obs).all()


def test_medium_bodies_go_to_an_idle_worker_and_decode_the_same() -> None:
    """Medium bodies are shared with a worker only while it has fewer than 3
    bodies in flight; the rest are left to the event loop (None). A real
    worker process decodes the shared ones, with the inline result."""
    import asyncio

    layout = build_layout(ServerConfig(), None)
    pool = decode_pool.DecodePool(layout.specs, layout.default_module(), True, threshold_bytes=1 << 20,
                                  share_bytes=256, workers=1)
    medium = body(*([GOOD] * 6), weights_seq_no=0)
    small = body(GOOD)
    assert 256 <= len(medium) < 1 << 20 and len(small) < 256

    async def run() -> list:
        pool.start()
        return await asyncio.gather(*(pool.decode(medium) for _ in range(8)), pool.decode(small))

    try:
        results = asyncio.run(run())
    finally:
        pool.close()
    shared = [r for r in results[:8] if r is not None]
    assert len(shared) == 3, "three in flight per worker, the other five decoded inline"
    assert results[8] is None, "small bodies are never shared"
    _, message = decode_message(medium)
    inline = outcome(EpisodeIngest(layout, True), message)
    for done in shared:
        assert outcome(EpisodeIngest(layout, True), done[2], done[3]) == inline


def test_fast_row_conversion_matches_numpy() -> None:
    """episodes._rows_as_array (the fast path for lists of numbers and lists of
    equal-length rows) gives exactly np.asarray's result or error, on seeded
    random nested input; when it says it packed the items, none was a string or null."""
    import random
    import warnings

    from tether.protocol.episodes import _rows_as_array

    def result(convert):
        try:
            array = convert()
        except (TypeError, ValueError) as exc:
            return ("error", type(exc).__name__)
        return ("ok", array.dtype, array.shape, array.tobytes())

    rng = random.Random(7)
    atoms = [0, -2, 1.5, 1e39, True, None, "1.5", "x", [1.0], [], {"a": 1}, 2**70, float("nan")]
    fast_paths = 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for _ in range(5000):
            width = rng.randint(0, 3)
            value = [[rng.choice(atoms) if rng.random() < 0.1 else rng.random() for _ in range(width + (rng.random() < 0.1))]
                     for _ in range(rng.randint(0, 5))]
            if value and rng.random() < 0.05:
                value[rng.randrange(len(value))] = rng.choice(atoms)
            flat_list = [row[0] if isinstance(row, list) and row else row for row in value]  # a list of numbers
            for candidate in (value, flat_list):
                for dtype in (np.float32, np.float64):
                    expected = result(lambda: np.asarray(candidate, dtype=dtype))
                    got = result(lambda: _rows_as_array(candidate, dtype)[0])
                    if got[0] == "ok" and _rows_as_array(candidate, dtype)[1]:
                        items = [x for row in candidate for x in (row if isinstance(row, list) else [row])]
                        assert not any(isinstance(x, (str, type(None))) for x in items), candidate
                    if expected[0] == "ok" and got[0] == "ok":
                        assert got[1:3] == expected[1:3], candidate
                        assert np.array_equal(np.frombuffer(got[3], dtype), np.frombuffer(expected[3], dtype),
                                              equal_nan=True), candidate
                        fast_paths += bool(candidate and width)
                    else:
                        assert got == expected, candidate
    assert fast_paths > 1000


def test_a_refused_record_from_a_worker_keeps_the_pool_and_the_error() -> None:
    """A MessageError made in a worker crosses the process boundary intact (code
    and message), and the pool is neither broken nor replaced: other bodies in
    flight still come back from the worker."""
    import asyncio

    layout = build_layout(ServerConfig(), None)
    pool = decode_pool.DecodePool(layout.specs, layout.default_module(), True, threshold_bytes=1 << 20,
                                  share_bytes=256, workers=1)
    good = body(*([GOOD] * 6))
    bad = body(*([GOOD] * 5), dict(GOOD, rewards=[1.0]))

    async def run() -> list:
        pool.start()
        return await asyncio.gather(pool.decode(good), pool.decode(bad), pool.decode(good))

    try:
        results = asyncio.run(run())
        executor = pool._pool
        again = asyncio.run(pool.decode(good))
        assert pool._pool is executor and executor is not None, "the worker pool was replaced"
    finally:
        pool.close()
    assert all(r is not None for r in results), "every body came back from the worker"
    assert again is not None
    _, message = decode_message(bad)
    inline = outcome(EpisodeIngest(layout, True), message)
    assert inline[0] == "error"
    assert outcome(EpisodeIngest(layout, True), results[1][2], results[1][3]) == inline


def test_a_deeply_nested_body_is_refused_in_the_worker_and_its_answer_crosses_back() -> None:
    """An unknown field nested 900 deep: the worker refuses the body before parsing it
    (INVALID_JSON, like inline decoding), and its answer pickles. A parsed 900-deep
    field did not, and the body was then parsed again on the event loop."""
    import pickle

    layout = build_layout(ServerConfig(), None)
    decode_pool._init_worker(os.getppid(), layout.specs, layout.default_module(), True)
    data = body(*([GOOD] * 50)).replace(b'"episodes"', b'"x": ' + b"[" * 900 + b"]" * 900 + b', "episodes"', 1)
    done = decode_pool._decode_in_worker(data)
    assert done[:2] == ("error", "INVALID_JSON"), done[:2]
    assert pickle.loads(pickle.dumps(done)) == done
    with pytest.raises(MessageError) as info:
        decode_message(data)
    assert (info.value.code.value, info.value.message) == done[1:3]
