"""The scripted server behind ``tether check-client``: it walks one client program through
protocol 1.3 and fills in a row per check (checks.py) from what the client sends."""

from __future__ import annotations

import asyncio
import hashlib
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

from tether.protocol.distributions import log_prob
from tether.protocol.episodes import EpisodeChunk, decode_episodes
from tether.protocol.errors import ErrorCode, FramingError, MessageError
from tether.protocol.framing import FrameDecoder, encode_frame
from tether.protocol.messages import MessageType, decode_message, error_message, parse_version
from tether.protocol.onnx_codec import encode_onnx

from .checks import ROWS, Row
from .echo_env import (ACTION_SPACE, MODEL_WEIGHTS, OBS_SPACE, STEPS_PER_SAMPLE, build_model, config_message,
                       dist_inputs)

#: The heartbeat_interval_s announced in SET_CONFIG unless told otherwise.
HEARTBEAT_S = 0.5
#: A client that acts while batches are in flight may send this many batches after the one whose
#: answer carried the new model before its steps must come from that model: the two its send
#: queue holds (2 x env_steps_per_sample agent steps) and one cut while the engine waited for room.
SWAP_GRACE_BATCHES = 3
#: How long a client that owes a resend may take to reconnect.
RECONNECT_WAIT_S = 10.0


@dataclass
class Batch:
    """One EPISODES_AND_GET_STATE as received."""

    session: Any
    seq: Any
    fingerprint: str
    connection: int


@dataclass
class _Connection:
    index: int
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    decoder: FrameDecoder
    announced_version: bool = False
    requests: list[str] = field(default_factory=list)


class _Drop(Exception):
    """The script ends this connection now."""


class ClientChecker:
    """The scripted server: one instance checks one client program."""

    def __init__(self, host: str = "127.0.0.1", port: int = 5556, timeout_s: float = 120.0,
                 heartbeat_s: float = HEARTBEAT_S, auth_token: str | None = None, verbose: bool = False) -> None:
        self.host, self.port, self.timeout_s = host, port, timeout_s
        self.heartbeat_s = heartbeat_s
        self.auth_token = auth_token
        self.verbose = verbose
        self.rows = {name: Row() for name, _ in ROWS}
        self._models = {v: encode_onnx(build_model(v)) for v in MODEL_WEIGHTS}
        self._config_frame = encode_frame(config_message(heartbeat_s))
        self._current = 0  # the weights version being served
        self._batches: list[Batch] = []  # every batch, resends included
        self._new_batches = 0  # batches that were not resends
        self._session: Any = None
        self._pending_resend: Batch | None = None  # the batch whose answer the script withheld
        self._pending_reason = ""
        self._refused: Batch | None = None
        self._after_duplicate = False
        self._after_connection_error: Batch | None = None
        self._steps_by_version: dict[int, int] = {0: 0, 1: 0}
        self._outside_box = 0
        self._connections = 0
        self._live: asyncio.Task | None = None
        self._finished: asyncio.Event | None = None  # created in run(), on the serving loop
        self._heartbeats: dict[int, list[float]] = {}  # connection -> PINGs after its handshake
        self._swap_batch: int | None = None
        self._new_model_seen = False
        self._episode_versions: dict[str, int] = {}  # episode id -> newest model its steps used
        self._reconnected_after_error = False
        self._log: list[str] = []

    # -- running -----------------------------------------------------------------

    async def run(self, ready: asyncio.Event | None = None) -> int:
        """Serve until the client is done (or the timeout); return the number of failed rows."""
        self._finished = asyncio.Event()
        server = await asyncio.start_server(self._on_connect, self.host, self.port)
        self.port = server.sockets[0].getsockname()[1]
        print(f"tether check-client: listening on {self.host}:{self.port}", flush=True)
        if ready is not None:
            ready.set()
        try:
            await asyncio.wait_for(self._finished.wait(), self.timeout_s)
        except asyncio.TimeoutError:
            self._note(f"timed out after {self.timeout_s:g} s")
        server.close()
        if self._live is not None:
            self._live.cancel()
            await asyncio.gather(self._live, return_exceptions=True)
        self._conclude()
        return self.report()

    async def _on_connect(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._connections += 1
        self._reconnected_after_error = self._after_connection_error is not None
        conn = _Connection(self._connections, reader, writer, FrameDecoder())
        self._live = asyncio.current_task()
        try:
            await self._serve(conn)
        except _Drop:
            pass
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()
            try:
                await writer.wait_closed()
            except (ConnectionError, asyncio.CancelledError):
                pass
        # A client that owes a resend gets time to reconnect; one that closed on its own is done.
        owed = self._pending_resend is not None or self._after_connection_error is not None
        wait = RECONNECT_WAIT_S if owed else 2.0
        asyncio.get_running_loop().create_task(self._end_unless_reconnect(conn.index, wait))

    async def _end_unless_reconnect(self, index: int, wait: float) -> None:
        """The connection ended: the run is over unless the client connects again within ``wait`` s."""
        await asyncio.sleep(wait)
        if self._connections == index and self._finished is not None:
            self._finished.set()

    async def _serve(self, conn: _Connection) -> None:
        while True:
            data = await conn.reader.read(1 << 20)
            if not data:
                return
            try:
                bodies = conn.decoder.feed(data)
            except FramingError as exc:
                self._note(f"connection {conn.index}: client sent unframeable bytes: {exc}")
                conn.writer.write(encode_frame(error_message(exc.code, exc.message)))
                raise _Drop from None
            for body in bodies:
                await self._handle(conn, body)
            await conn.writer.drain()

    def _answer(self, conn: _Connection, message: dict[str, Any]) -> None:
        conn.writer.write(encode_frame(message))

    # -- requests ----------------------------------------------------------------

    async def _handle(self, conn: _Connection, body: bytes) -> None:
        try:
            kind, message = decode_message(body)
        except MessageError as exc:
            self._note(f"connection {conn.index}: undecodable body: {exc}")
            self._answer(conn, error_message(exc.code, exc.message))
            return
        first_batch_here = kind in (MessageType.EPISODES, MessageType.EPISODES_AND_GET_STATE) and not any(
            r.startswith("EPISODES") for r in conn.requests)
        conn.requests.append(kind.value)
        if kind is MessageType.PING:
            self._ping(conn, message)
        elif kind is MessageType.GET_CONFIG:
            conn.writer.write(self._config_frame)
        elif kind is MessageType.GET_STATE:
            self._answer(conn, self._state(conn, message.get("weights_seq_no")))
        elif kind in (MessageType.EPISODES, MessageType.EPISODES_AND_GET_STATE):
            if first_batch_here:
                self._check_handshake(conn)
            await self._batch(conn, kind, message)
        else:
            code = ErrorCode.NOT_A_REQUEST if kind.value in ("PONG", "SET_CONFIG", "SET_STATE", "ERROR",
                                                             "AGENT_MODULES") else ErrorCode.INVALID_FIELD
            self._answer(conn, error_message(code, f"tether check-client does not serve {kind.value}", kind.value))

    def _ping(self, conn: _Connection, message: dict[str, Any]) -> None:
        version = message.get("protocol_version")
        handshake = self.rows["handshake"]
        if conn.requests.count("PING") == 1:
            try:
                major, _ = parse_version(str(version))
                if version is None or major != 1:
                    raise ValueError
                conn.announced_version = True
            except ValueError:
                handshake.fail(f"connection {conn.index}: PING without a protocol_version 1.x (got {version!r})")
            if self.auth_token is not None and message.get("auth_token") != self.auth_token:
                handshake.fail(f"connection {conn.index}: PING without the right auth_token")
        elif "GET_STATE" in conn.requests or "GET_CONFIG" in conn.requests:
            self._heartbeats.setdefault(conn.index, []).append(time.monotonic())
        self._answer(conn, {"type": "PONG", "protocol_version": "1.3", "server": "tether-check"})

    def _state(self, conn: _Connection, claimed: Any) -> dict[str, Any]:
        message: dict[str, Any] = {"type": "SET_STATE", "weights_seq_no": self._current}
        holds = isinstance(claimed, int) and not isinstance(claimed, bool) and claimed == self._current
        if not (holds and conn.announced_version):
            message["onnx_file"] = self._models[self._current]
        return message

    def _check_handshake(self, conn: _Connection) -> None:
        before = conn.requests[:-1]
        reconnect_row = {"drop": "drop_reconnect", "garbage": "garbage_reconnect"}.get(self._pending_reason)
        row = self.rows[reconnect_row] if self._pending_resend is not None and reconnect_row else self.rows["handshake"]
        if not before or before[0] != "PING":
            row.fail(f"connection {conn.index}: first request was {before[0] if before else 'a batch'}, not PING")
        elif "GET_CONFIG" not in before:
            row.fail(f"connection {conn.index}: batch sent before GET_CONFIG")
        elif conn.index == 1 and "GET_STATE" not in before:
            row.fail("batch sent before GET_STATE")
        elif conn.index == 1:
            row.ok()

    # -- batches -----------------------------------------------------------------

    async def _batch(self, conn: _Connection, kind: MessageType, message: dict[str, Any]) -> None:
        rows = self.rows
        session, seq = message.get("client_session"), message.get("batch_seq")
        fingerprint = hashlib.sha256(orjson.dumps(_without_runs(message.get("episodes")))).hexdigest()
        batch = Batch(session, seq, fingerprint, conn.index)
        self._check_ids(batch)
        if kind is not MessageType.EPISODES_AND_GET_STATE:
            rows["records_valid"].fail("an on-policy server (force_on_policy true) got EPISODES, not EPISODES_AND_GET_STATE")
        pending = self._pending_resend
        if pending is not None:
            self._check_resend(pending, batch)
            self._batches.append(batch)
            self._pending_resend = None
            self._after_duplicate = True
            self._answer(conn, self._state(conn, message.get("weights_seq_no")))
            return
        self._batches.append(batch)
        self._new_batches += 1
        n = self._new_batches
        if self._refused is not None and n == 2:
            if batch.fingerprint == self._refused.fingerprint or (seq is not None and seq == self._refused.seq):
                rows["error_reply"].fail("the refused batch was sent again")
            else:
                rows["error_reply"].ok()
        if self._after_connection_error is not None:
            self._check_after_connection_error(self._after_connection_error, batch)
            self._after_connection_error = None
        if self._after_duplicate:
            self._after_duplicate = False
            previous = self._batches[-2]
            if _is_int(seq) and _is_int(previous.seq) and seq == previous.seq + 1:
                rows["duplicate_reply"].ok()
            else:
                rows["duplicate_reply"].fail(f"after the resent batch {previous.seq!r} came batch_seq {seq!r}")
        try:
            chunks = decode_episodes(message, OBS_SPACE, ACTION_SPACE, require_logp=True)
        except MessageError as exc:
            rows["records_valid"].fail(f"batch {n}: {exc.code.value}: {exc.message}")
            self._answer(conn, error_message(exc.code, exc.message, kind.value))
            return
        versions = self._check_steps(n, chunks)
        self._check_swap(n, versions, message.get("weights_seq_no"))
        if n == 1:
            self._refused = batch
            self._answer(conn, error_message(ErrorCode.INVALID_FIELD,
                                             "tether check-client refuses this batch on purpose: report it and go on",
                                             kind.value))
        elif n == 2:
            self._current = 1
            self._swap_batch = n
            self._answer(conn, self._state(conn, None))
        elif n == 4:
            self._pending_resend, self._pending_reason = batch, "drop"
            self._note(f"batch {n}: closing the connection without an answer")
            raise _Drop
        elif n == 5:
            await self._garbage(conn, batch)
        elif n == 6:
            # Answered; then a connection-level refusal closes the connection (§6.6).
            self._answer(conn, self._state(conn, message.get("weights_seq_no")))
            self._answer(conn, error_message(ErrorCode.CLIENT_TIMEOUT, "tether check-client closes this connection "
                                             "on purpose: reconnect and go on"))
            self._after_connection_error = batch
            await conn.writer.drain()
            raise _Drop
        else:
            self._answer(conn, self._state(conn, message.get("weights_seq_no")))

    def _check_ids(self, batch: Batch) -> None:
        row = self.rows["batch_ids"]
        session, seq = batch.session, batch.seq
        if not isinstance(session, str) or not 1 <= len(session) <= 128:
            row.fail(f"client_session must be a string of 1..128 characters, got {session!r}")
            return
        if not _is_int(seq) or seq < 1:
            row.fail(f"batch_seq must be an integer >= 1, got {seq!r}")
            return
        if self._session is None:
            self._session = session
            if seq != 1:
                row.fail(f"the first batch has batch_seq {seq}, expected 1")
        elif session != self._session:
            row.fail(f"client_session changed from {self._session!r} to {session!r}")
        elif any(b.seq == seq for b in self._batches):  # the same number again: a resend
            if any(b.seq == seq and b.fingerprint != batch.fingerprint for b in self._batches):
                row.fail(f"batch_seq {seq} was used again for a different batch")
        elif self._pending_resend is None and self._batches:
            last = max((b.seq for b in self._batches if _is_int(b.seq)), default=0)
            if seq != last + 1:
                row.fail(f"a new batch has batch_seq {seq}, expected {last + 1}")
        if row.passed is None and len(self._batches) >= 5:
            row.ok()

    def _check_after_connection_error(self, answered: Batch, batch: Batch) -> None:
        row = self.rows["connection_error"]
        if batch.connection == answered.connection:
            row.fail("the client kept using the connection after a connection-level ERROR")
        elif batch.fingerprint == answered.fingerprint:
            row.fail("the client resent a batch that had been answered before the connection-level ERROR")
        elif _is_int(answered.seq) and batch.seq != answered.seq + 1:
            row.fail(f"after the connection-level ERROR came batch_seq {batch.seq!r}, expected {answered.seq + 1} "
                     "(a batch sent on the closed connection was lost, or taken as refused)")
        elif not _is_int(answered.seq):
            row.fail("batches carry no batch_seq, so nothing shows that no batch was lost")
        else:
            row.ok()

    def _check_resend(self, pending: Batch, batch: Batch) -> None:
        row_name = "resend_same_seq" if self._pending_reason == "drop" else "garbage_reconnect"
        row = self.rows[row_name]
        if not isinstance(batch.session, str) or not _is_int(batch.seq):
            row.fail("the batch resent after the reconnect has no client_session/batch_seq")
        elif batch.session != pending.session or batch.seq != pending.seq:
            row.fail(f"the first batch after the reconnect has client_session/batch_seq {batch.session!r}/{batch.seq!r}, "
                     f"the unanswered one had {pending.session!r}/{pending.seq!r}")
        elif batch.fingerprint != pending.fingerprint:
            row.fail("the resent batch's episodes differ from the unanswered batch's")
        else:
            row.ok()
        if self._pending_reason == "drop":
            self.rows["drop_reconnect"].ok()

    async def _garbage(self, conn: _Connection, batch: Batch) -> None:
        """Answer with bytes that are not a frame header; a client must close and reconnect."""
        self._pending_resend, self._pending_reason = batch, "garbage"
        conn.writer.write(b"NOT-A-FRAME-HEADER")
        await conn.writer.drain()
        try:
            data = await asyncio.wait_for(conn.reader.read(1 << 20), 10.0)
        except asyncio.TimeoutError:
            self.rows["garbage_reconnect"].fail("the client kept the connection open 10 s after a bad frame header")
            raise _Drop from None
        if data:
            self.rows["garbage_reconnect"].fail("the client kept sending on a connection whose framing broke")
        raise _Drop

    def _check_steps(self, n: int, chunks: list[EpisodeChunk]) -> list[tuple[str, list[int]]]:
        """Per record, its episode id and which served model each step's logp comes from
        (-1: none); echo-env checks."""
        rows = self.rows
        versions: list[tuple[str, list[int]]] = []
        for c, chunk in enumerate(chunks):
            obs = chunk.obs.astype(np.float64)
            actions = chunk.actions.reshape(chunk.env_steps, -1).astype(np.float64)
            clipped = np.clip(actions[:, 0], -1.0, 1.0)
            if not np.allclose(obs[1:, 1], clipped, atol=1e-5):
                t = int(np.argmax(~np.isclose(obs[1:, 1], clipped, atol=1e-5)))
                rows["engine_gets_clipped_action"].fail(
                    f"batch {n}, record {c}: actions[{t}] = {actions[t, 0]:.6g} but the env executed {obs[t + 1, 1]:.6g} "
                    f"(expected clip to [-1, 1]: {clipped[t]:.6g})")
            elif not np.allclose(chunk.rewards, clipped, atol=1e-5):
                rows["engine_gets_clipped_action"].fail(f"batch {n}, record {c}: rewards are not the executed actions")
            self._outside_box += int(np.sum(np.abs(actions[:, 0]) > 1.0))
            inputs = {v: dist_inputs(v, chunk.obs[:-1]) for v in MODEL_WEIGHTS}
            record_versions: list[int] = []
            # Records without an episode_id are checked as one sequence.
            versions.append((str(chunk.episode_id) if chunk.episode_id is not None else "", record_versions))
            for t in range(chunk.env_steps):
                match = -1
                for v, d in inputs.items():
                    lp = log_prob(ACTION_SPACE, d[t], actions[t])
                    if abs(lp - float(chunk.action_logp[t])) <= 1e-3 + 1e-4 * abs(lp) and (
                            chunk.action_dist_inputs is None or np.allclose(chunk.action_dist_inputs[t], d[t], atol=1e-4)):
                        match = v
                        break
                if match < 0:
                    expected = ", ".join(f"model {v}: {log_prob(ACTION_SPACE, d[t], actions[t]):.6g}"
                                         for v, d in inputs.items())
                    rows["logp_from_served_model"].fail(
                        f"batch {n}, record {c}, step {t}: action_logp {float(chunk.action_logp[t]):.6g} for action "
                        f"{actions[t, 0]:.6g} fits no served model ({expected})")
                else:
                    self._steps_by_version[match] += 1
                record_versions.append(match)
        return versions

    def _check_swap(self, n: int, versions: list[tuple[str, list[int]]], claimed: Any) -> None:
        """Within an episode, steps move from the old model to the new one, never back; a batch
        claims the oldest version its steps used (§7.6); the new model is in use soon after the
        swap. Across episodes the order is free: a client that plays several episodes at once, or
        holds back an agent's last step (§10.4), may send an old-model step of one episode after
        new-model steps of another; and one that acts while batches are in flight may still send
        a few batches it cut before the swap."""
        row = self.rows["model_swap"]
        known = [v for _, steps in versions for v in steps if v >= 0]
        if self._swap_batch is None and 1 in known:
            row.fail(f"batch {n} used model 1 before it was sent")
        # An episode first seen after model 1 was in use began after the swap (one episode
        # at a time, docs/check-client.md step 3): it must not start with model 0.
        floor = 1 if self._new_model_seen else 0
        for episode, steps in versions:
            ordered = [self._episode_versions.get(episode, floor)] + [v for v in steps if v >= 0]
            if any(a > b for a, b in zip(ordered, ordered[1:])):
                row.fail(f"batch {n}: episode {episode!r} went back from the new model to the old one")
            self._episode_versions[episode] = ordered[-1]
            floor = max(floor, ordered[-1])
        if known and _is_int(claimed) and claimed != min(known):
            row.fail(f"batch {n} claims weights_seq_no {claimed}, but its oldest steps come from model {min(known)}")
        self._new_model_seen = self._new_model_seen or 1 in known
        if self._swap_batch is not None and n > self._swap_batch + SWAP_GRACE_BATCHES:
            if not self._new_model_seen:
                row.fail(f"batch {n}, the {n - self._swap_batch}th after the swap, still uses the old model")
            elif 0 in known:
                row.fail(f"batch {n}, the {n - self._swap_batch}th after the swap, has steps of the old model")
            elif known and set(known) == {1}:
                row.ok()

    # -- report ------------------------------------------------------------------

    def _conclude(self) -> None:
        rows = self.rows
        total = sum(self._steps_by_version.values())
        if total >= 2 * STEPS_PER_SAMPLE:
            if self._outside_box == 0:
                rows["raw_box_samples"].fail(
                    f"all {total} recorded Box actions lie inside [-1, 1], though about a third of the raw samples of "
                    "the served models fall outside: the records carry clipped actions")
            else:
                rows["raw_box_samples"].ok()
        for name in ("records_valid", "engine_gets_clipped_action", "logp_from_served_model"):
            if total >= 2 * STEPS_PER_SAMPLE:
                rows[name].ok()
            else:
                rows[name].fail(f"only {total} valid steps arrived")
        pings = max(self._heartbeats.values(), key=len, default=[])
        gaps = np.diff(pings) if len(pings) >= 2 else np.array([])
        if len(pings) >= 3 and np.all(gaps >= 0.4 * self.heartbeat_s) and np.median(gaps) <= 2.5 * self.heartbeat_s:
            rows["heartbeat"].ok()
        elif len(pings) >= 3:
            rows["heartbeat"].fail(f"PINGs came {np.round(gaps, 2).tolist()} s apart; heartbeat_interval_s is "
                                   f"{self.heartbeat_s:g}")
        else:
            rows["heartbeat"].fail(f"{len(pings)} PING(s) while idle after the handshake; expected one every "
                                   f"{self.heartbeat_s:g} s")
        if rows["error_reply"].passed is None and self._new_batches < 2:
            rows["error_reply"].fail("the client sent no batch after the ERROR answer")
        if rows["garbage_reconnect"].passed is None and self._pending_reason == "garbage" and self._pending_resend:
            rows["garbage_reconnect"].fail("the client did not reconnect and resend after a bad frame header")
        if self._after_connection_error is not None and self._reconnected_after_error:
            rows["connection_error"].fail(
                "the client reconnected after the connection-level ERROR but sent no further batch (a client that "
                "drops queued batches while the server is slow can run out: docs/check-client.md, step 2)")
        elif self._after_connection_error is not None:
            rows["connection_error"].fail("the client did not come back after a connection-level ERROR")
        if self._pending_reason == "drop" and self._pending_resend is not None:
            rows["drop_reconnect"].fail("the client did not come back after the connection was closed")

    def _note(self, text: str) -> None:
        self._log.append(text)
        if self.verbose:
            print(f"tether check-client: {text}", flush=True)

    def report(self) -> int:
        """Print the table; return the number of rows that did not pass."""
        width = max(len(name) for name, _ in ROWS)
        failures = 0
        print(f"{'check':<{width}}  result  reason")
        for name, description in ROWS:
            row = self.rows[name]
            if row.passed is True:
                print(f"{name:<{width}}  PASS    {description}")
            else:
                failures += 1
                reason = row.reason or "not reached: " + description
                print(f"{name:<{width}}  FAIL    {reason}")
        print(f"{len(ROWS) - failures} of {len(ROWS)} checks passed", flush=True)
        return failures


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _without_runs(episodes: Any) -> Any:
    """The records as a resend must repeat them: weights_seq_no_runs goes only on the connection its
    versions were learned on, so a resend on a new connection leaves it out (§10.1)."""
    if not isinstance(episodes, list):
        return episodes
    out = []
    for record in episodes:
        if isinstance(record, dict):
            record = {k: v for k, v in record.items() if k != "weights_seq_no_runs"}
            if isinstance(record.get("agents"), dict):
                record["agents"] = {a: ({k: v for k, v in e.items() if k != "weights_seq_no_runs"}
                                        if isinstance(e, dict) else e) for a, e in record["agents"].items()}
        out.append(record)
    return out
