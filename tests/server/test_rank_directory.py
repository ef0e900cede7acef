"""**[1.9]** What a rank of a group adds to PONG (§6.7): every rank's address, and a redirect of a new
1.9 client to the least loaded rank; the group's exactly-once marks merged at its start. The two-rank
group of tests/integration/test_scale_out.py gives a fleet one address and checks the spread."""

from __future__ import annotations

import asyncio
import json

import pytest

from tether.protocol import FrameDecoder, encode_frame
from tether.server.config import ServerConfig
from tether.server.distributed.rank_directory import RankDirectory, advertised_host
from tether.server.ingest.batch_dedup import BatchDedup, BatchId, merged_marks
from tether.server.module_setup import build_layout
from tether.server.transport.tcp import TetherServer
from tether.server.trainer import Trainer

ADDRESSES = ["10.0.0.5:9100", "10.0.0.5:9101", "10.0.0.6:9100"]
PING = {"type": "PING", "protocol_version": "1.9"}


def directory(loads: list[float], rank: int = 0) -> RankDirectory:
    d = RankDirectory(rank, list(ADDRESSES))
    d.agreed(loads)
    return d


def test_every_pong_names_the_ranks_and_an_even_group_keeps_its_client() -> None:
    assert directory([0, 0, 0]).pong_fields(PING, 1, clients_here=1) == {"ranks": ADDRESSES}
    assert directory([2, 2, 2]).pong_fields(PING, 1, clients_here=3) == {"ranks": ADDRESSES}, "a tie stays"


def test_a_busier_rank_redirects_to_the_least_loaded_and_counts_the_client_there() -> None:
    d = directory([3, 2, 1])
    assert d.pong_fields(PING, 10, clients_here=4)["redirect"] == "10.0.0.6:9100"
    assert d.loads[2] == 2 and d.redirected == [0, 0, 1]
    # The next new client, before the next agreement and before the first one closed: rank 1 and rank 2
    # now tie (2), the lower rank wins; the client told to move is no longer this rank's load.
    assert d.pong_fields(PING, 11, clients_here=5)["redirect"] == "10.0.0.5:9101"
    assert d.pong_fields(PING, 12, clients_here=6)["redirect"] == "10.0.0.6:9100"
    assert d.loads == [3, 3, 3] and "redirect" not in d.pong_fields(PING, 13, clients_here=7), "3 here, 3 and 3 there"
    d.left(10), d.left(11), d.left(12)
    d.agreed([5, 1, 1])  # (the next agreement's counts replace the estimates)
    assert d.pong_fields(PING, 14, clients_here=6)["redirect"] == "10.0.0.5:9101"


def test_a_burst_of_new_clients_all_still_connected_is_spread_evenly() -> None:
    """Every client of a burst is counted here until its connection closes; those told to move are not."""
    d = RankDirectory(0, ADDRESSES[:2])
    d.agreed([0, 0])
    moved = [("redirect" in d.pong_fields(PING, c, clients_here=c)) for c in range(1, 11)]
    assert sum(moved) == 5 and d.loads == [0, 5] and d.redirected == [0, 5], (moved, d.loads)


def test_a_heartbeat_ping_and_a_second_ping_of_a_connection_told_to_move_get_no_redirect() -> None:
    d = directory([9, 0, 0])
    assert "redirect" not in d.pong_fields({"type": "PING"}, 1, clients_here=10), "a heartbeat announces nothing"
    assert "redirect" in d.pong_fields(PING, 1, clients_here=10)
    assert "redirect" not in d.pong_fields(PING, 1, clients_here=10) and d.redirected == [0, 1, 0]


def test_a_connection_told_to_move_that_sends_more_is_counted_here_again_and_never_told_twice() -> None:
    """A redirect is advice (§6.7): a client that stays (it sends anything more) is this rank's load again
    and no longer the target's, so the next new client is weighed against it (before, it counted as
    leaving until it closed, rank 0 looked emptier and rank 1 fuller)."""
    d = RankDirectory(0, ADDRESSES[:2])
    d.agreed([2, 1])
    assert "redirect" in d.pong_fields(PING, 1, clients_here=3), "2 here without it, 1 there"
    assert d.loads[1] == 2
    d.heard_from(1)  # (a GET_CONFIG, or any body, on the connection it was told to leave)
    assert d.loads[1] == 1, "no longer counted where it was sent"
    assert d.pong_fields(PING, 2, clients_here=4).get("redirect") == ADDRESSES[1], "3 here, 1 there"
    assert "redirect" not in d.pong_fields(PING, 1, clients_here=4), "a client that stayed is not told again"
    # A client told to move before an agreement that stays after it: the agreement counted it here already.
    assert d.pong_fields(PING, 3, clients_here=5).get("redirect") == ADDRESSES[1]
    d.agreed([5, 1])
    d.heard_from(3)
    assert d.loads == [5, 1]
    d.heard_from(2), d.left(1), d.left(2), d.left(3)
    d.agreed([0, 0])
    assert d.pong_fields(PING, 1, clients_here=1) == {"ranks": ADDRESSES[:2]}, "a closed id is forgotten"


def test_clients_that_cannot_or_may_not_move_are_never_redirected() -> None:
    for ping in ({"type": "PING", "protocol_version": "1.8"}, {"type": "PING"}, {**PING, "redirected": True},
                 {"type": "PING", "protocol_version": "not-a-version"}, {"type": "PING", "protocol_version": 1.9}):
        fields = directory([9, 0, 0]).pong_fields(ping, 1, clients_here=10)
        assert fields == {"ranks": ADDRESSES}, (ping, fields)
    # "redirected" other than true is no claim of a redirect.
    assert "redirect" in directory([9, 0, 0]).pong_fields({**PING, "redirected": 1}, 1, clients_here=10)


def test_the_advertised_host_is_the_flag_the_bound_host_or_the_route_to_the_master() -> None:
    assert advertised_host("0.0.0.0", "trainer-0.tether") == "trainer-0.tether"
    assert advertised_host("10.1.2.3", None) == "10.1.2.3"
    assert advertised_host("0.0.0.0", None, {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}) == "127.0.0.1"


def test_the_groups_marks_merge_to_the_highest_batch_seq_of_each_session() -> None:
    merged = merged_marks([{"a": 4, "b": 9}, {"a": 7, "c": 1}, {}])
    assert merged == {"a": 7, "b": 9, "c": 1}
    dedup = BatchDedup()
    dedup.load_state(merged)
    assert dedup.is_duplicate(BatchId("a", 7)) and not dedup.is_duplicate(BatchId("a", 8))


def test_a_merged_table_trimmed_to_its_limit_keeps_every_ranks_recent_sessions() -> None:
    rank0 = {f"old-0-{i}": 1 for i in range(4)} | {"active-on-rank0": 9}
    rank1 = {f"old-1-{i}": 1 for i in range(4)} | {"active-on-rank1": 7}
    dedup = BatchDedup(max_sessions=4)
    dedup.load_state(merged_marks([rank0, rank1]))
    kept = dedup.state()
    assert {"active-on-rank0", "active-on-rank1"} <= set(kept) and len(kept) == 4, kept
    assert dedup.is_duplicate(BatchId("active-on-rank0", 9))


@pytest.mark.parametrize("instead", [{"type": "GET_CONFIG"}, {"type": "NOT_A_TYPE"}])
def test_the_server_counts_a_client_that_ignored_its_redirect_as_its_own_again(tmp_path, instead) -> None:
    """Real sockets to a rank's server (the group's directory given to a lone trainer): a client told to
    move that sends anything instead (a request, or one the server refuses) stays, so the next new
    clients are weighed against it."""

    async def run() -> list:
        config = ServerConfig(port=0, tensorboard=False, quiet=True, logdir=str(tmp_path), checkpoint_every=0)
        trainer = Trainer(config, build_layout(config))
        server = TetherServer(trainer)
        await server.start()
        trainer.directory = RankDirectory(0, [f"127.0.0.1:{server.port}", "127.0.0.1:1"])
        trainer.directory.agreed([0, 0])
        pongs, streams = [], []
        try:
            for _ in range(3):
                streams.append(await asyncio.open_connection("127.0.0.1", server.port))
                pongs.append(await ask(*streams[-1], PING))
                if len(streams) == 1:
                    streams.append(await asyncio.open_connection("127.0.0.1", server.port))
                    pongs.append(await ask(*streams[-1], PING))
                    answer = await ask(*streams[-1], instead)  # told to move, it stays
                    assert answer["type"] == ("SET_CONFIG" if instead["type"] == "GET_CONFIG" else "ERROR"), answer
        finally:
            for _, writer in streams:
                writer.close()
            await server.stop()
            await trainer.close(checkpoint=False)
        return [pong.get("redirect") for pong in pongs]

    # 1st: none here, none there: it stays. 2nd: 1 here, 0 there: told to move, it stays (0 there again).
    # 3rd: 2 here (it counted as leaving before: 1), 0 there: moves (1 there). 4th: 2 here (less the 3rd,
    # leaving), 1 there: moves (before: 1 here, 2 there (the 2nd counted there): stays).
    redirects = asyncio.run(run())
    assert redirects == [None, "127.0.0.1:1", "127.0.0.1:1", "127.0.0.1:1"], redirects


async def ask(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, message: dict) -> dict:
    """One request on a raw connection, and its answer."""
    writer.write(encode_frame(message))
    decoder, bodies = FrameDecoder(), []
    while not bodies:
        bodies = decoder.feed(await reader.read(1 << 20))
    return json.loads(bodies[0])
