"""**[1.9]** What a rank of a group adds to PONG (§6.7): every rank's address, and a redirect of a new
1.9 client to the least loaded rank; the group's exactly-once marks merged at its start. The two-rank
group of tests/integration/test_scale_out.py gives a fleet one address and checks the spread."""

from __future__ import annotations

from tether.server.distributed.rank_directory import RankDirectory, advertised_host
from tether.server.ingest.batch_dedup import BatchDedup, BatchId, merged_marks

ADDRESSES = ["10.0.0.5:9100", "10.0.0.5:9101", "10.0.0.6:9100"]
PING = {"type": "PING", "protocol_version": "1.9"}


def directory(loads: list[float], rank: int = 0) -> RankDirectory:
    d = RankDirectory(rank, list(ADDRESSES))
    d.agreed(loads)
    return d


def test_every_pong_names_the_ranks_and_an_even_group_keeps_its_client() -> None:
    assert directory([0, 0, 0]).pong_fields(PING, "1.9", clients_here=1) == {"ranks": ADDRESSES}
    assert directory([2, 2, 2]).pong_fields(PING, "1.9", clients_here=3) == {"ranks": ADDRESSES}, "a tie stays"


def test_a_busier_rank_redirects_to_the_least_loaded_and_counts_the_client_there() -> None:
    d = directory([3, 2, 1])
    assert d.pong_fields(PING, "1.9", clients_here=4)["redirect"] == "10.0.0.6:9100"
    assert d.loads[2] == 2 and d.redirected == [0, 0, 1]
    # The next new client, before the next agreement: rank 1 and rank 2 now tie (2), the lower rank wins.
    assert d.pong_fields(PING, "1.9", clients_here=4)["redirect"] == "10.0.0.5:9101"
    # A burst is spread, not all sent to the rank that looked emptiest at the agreement.
    d.pong_fields(PING, "1.9", clients_here=4)
    assert d.loads == [3, 3, 3] and "redirect" not in d.pong_fields(PING, "1.9", clients_here=4)
    d.agreed([5, 1, 1])  # (the next agreement's counts replace the estimates)
    assert d.pong_fields(PING, "1.9", clients_here=6)["redirect"] == "10.0.0.5:9101"


def test_clients_that_cannot_or_may_not_move_are_never_redirected() -> None:
    for ping, version in (({"type": "PING", "protocol_version": "1.8"}, "1.8"), ({"type": "PING"}, None),
                          ({**PING, "redirected": True}, "1.9"), (PING, "not-a-version")):
        fields = directory([9, 0, 0]).pong_fields(ping, version, clients_here=10)
        assert fields == {"ranks": ADDRESSES}, (ping, fields)
    # "redirected" other than true is no claim of a redirect.
    assert "redirect" in directory([9, 0, 0]).pong_fields({**PING, "redirected": 1}, "1.9", clients_here=10)


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
