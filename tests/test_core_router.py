"""Routers' rules on hand-built states, and the fleet's accounting on the one clock."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from stallfree.core import PromptBlocks, Request
from stallfree.core.router import (
    CacheAware,
    CacheAwareConfig,
    ConsistentHash,
    LeastRequests,
    PowerOfTwo,
    PrefixTree,
    RoundRobin,
    make_router,
)
from stallfree.sim.fleet import run_fleet
from tests.factories import OneSecondCosts, make_scheduler


def req(rid: str, ids: tuple[int, ...] | None = None, tokens: int = 64) -> Request:
    blocks = None if ids is None else PromptBlocks(ids, tokens_per_id=16)
    return Request(rid, tokens if ids is None else 16 * len(ids), 4, prompt_blocks=blocks)


def test_round_robin_takes_replicas_in_turn_whatever_the_load() -> None:
    router = RoundRobin()
    assert [router.route(req(str(i)), [9, 0, 0]) for i in range(5)] == [0, 1, 2, 0, 1]


def test_least_requests_takes_the_fewest_in_flight_lowest_index_on_a_tie() -> None:
    router = LeastRequests()
    assert router.route(req("a"), [3, 1, 1]) == 1
    assert router.route(req("b"), [0, 0, 2]) == 0


def test_power_of_two_takes_the_less_loaded_of_two_draws_and_is_seeded() -> None:
    loads = [5, 0, 9, 1]
    picks = [PowerOfTwo(seed=3).route(req("a"), loads) for _ in range(2)]
    assert picks[0] == picks[1]
    router = PowerOfTwo(seed=1)
    chosen = [router.route(req(str(i)), loads) for i in range(200)]
    assert 2 not in chosen  # the busiest loses every draw it is in
    assert set(chosen) == {0, 1, 3}
    assert PowerOfTwo().route(req("x"), [7]) == 0


def test_consistent_hash_keeps_a_session_on_one_replica_whatever_the_load() -> None:
    router = ConsistentHash(4)
    turns = [Request(f"{s}-{t}", 8, 2, session_id=f"s{s}") for s in range(200) for t in range(3)]
    chosen: dict[str, set[int]] = {}
    for i, r in enumerate(turns):
        load = [i % 7, 0, 50, 3]
        assert r.session_id is not None
        chosen.setdefault(r.session_id, set()).add(router.route(r, load))
    assert all(len(replicas) == 1 for replicas in chosen.values())
    counts = [sum(next(iter(c)) == i for c in chosen.values()) for i in range(4)]
    assert min(counts) >= 25  # 200 sessions spread over 4 replicas, none starved
    # a replica added moves only the sessions the new one takes
    wider = ConsistentHash(5)
    moved = [
        sid for sid, c in chosen.items() if wider.route(Request("x", 8, 2, session_id=sid), [0] * 5) not in c
    ]
    assert all(wider.route(Request("x", 8, 2, session_id=sid), [0] * 5) == 4 for sid in moved)
    assert 10 <= len(moved) <= 80
    # no session id: the request id is the key
    assert router.route(Request("r1", 8, 2), [0] * 4) == router.route(Request("r1", 9, 3), [9] * 4)


def test_cache_aware_follows_the_prefix_above_the_threshold() -> None:
    router = CacheAware(2)
    assert router.route(req("a", (1, 2, 3, 4)), [0, 0]) == 0  # no match anywhere: least loaded
    assert router.route(req("b", (9, 8, 7, 6)), [1, 0]) == 1
    # 3 of 4 units match replica 0 (0.75 > 0.3): it goes there though replica 1 is idle
    assert router.route(req("c", (1, 2, 3, 5)), [1, 0]) == 0
    # 1 of 4 (0.25 <= 0.3): the least loaded
    assert router.route(req("d", (1, 7, 7, 7)), [1, 0]) == 1


def test_cache_aware_balances_when_loads_are_imbalanced_past_both_thresholds() -> None:
    router = CacheAware(2)
    router.route(req("a", (1, 2, 3, 4)), [0, 0])
    assert router.route(req("b", (1, 2, 3, 4)), [100, 10]) == 1  # 90 > 64 and 100 > 15
    assert router.route(req("c", (1, 2, 3, 5)), [10, 100]) == 0  # 90 > 64 and 100 > 15
    assert router.route(req("d", (1, 2, 3, 5)), [100, 70]) == 0  # 30 <= 64: the cache wins
    assert router.route(req("e", (1, 2, 3, 5)), [100, 90]) == 0  # 100 <= 135: not imbalanced
    assert router.route(req("f"), [3, 1]) == 1  # no blocks: nothing to match, least loaded


def test_cache_aware_gives_a_tie_to_the_replica_a_prompt_last_went_through_it_to() -> None:
    """Replicas that match as deep: vllm-router's tree answers the last tenant of the deepest
    matched node, not the lowest index."""
    router = CacheAware(3)
    assert router.route(req("a", (7, 1)), [0, 0, 0]) == 0
    assert router.route(req("b", (7, 2)), [100, 0, 0]) == 1  # imbalanced: the least loaded
    assert router.route(req("c", (7, 3)), [0, 0, 0]) == 1  # 0 and 1 match 50%: (7,) went last to 1
    assert router.route(req("d", (7, 1, 9)), [0, 0, 0]) == 0  # the deepest match wins over the last
    assert router.route(req("e", (7, 4)), [0, 0, 0]) == 0  # and 0 took (7,) last


def test_the_chosen_replicas_tree_takes_the_prompt() -> None:
    router = CacheAware(3)
    router.route(req("a", (5, 6)), [0, 0, 0])
    assert [tree.match((5, 6)) for tree in router.trees] == [2, 0, 0]


def test_a_tree_past_its_size_forgets_the_least_recently_used_branch() -> None:
    tree = PrefixTree(max_size=6)
    tree.insert((1, 2, 3))
    tree.insert((4, 5, 6))
    tree.match((4, 5, 6))  # matching does not count as use: routing there does
    tree.insert((1, 2, 3))
    tree.insert((1, 2, 7))  # 7 nodes: the leaf of (4, 5, 6) is the least recently used
    assert tree.size == 6
    assert tree.match((1, 2, 7)) == 3 and tree.match((1, 2, 3)) == 3
    assert tree.match((4, 5, 6)) == 2


def test_cache_aware_config_is_vllm_routers_defaults() -> None:
    config = CacheAwareConfig()
    assert (config.cache_threshold, config.balance_abs_threshold, config.balance_rel_threshold) == (
        0.3,
        64,
        1.5,
    )


@st.composite
def fleets(draw: st.DrawFn) -> tuple[int, str, list[Request]]:
    n = draw(st.integers(1, 4))
    name = draw(
        st.sampled_from(["round-robin", "least-requests", "power-of-two", "consistent-hash", "cache-aware"])
    )
    reqs = []
    t = 0.0
    for i in range(draw(st.integers(1, 30))):
        t += draw(st.floats(0, 2))
        ids = tuple(draw(st.lists(st.integers(0, 5), min_size=1, max_size=6)))
        reqs.append(
            Request(str(i), 16 * len(ids), draw(st.integers(1, 12)), t, prompt_blocks=PromptBlocks(ids, 16))
        )
    return n, name, reqs


@settings(max_examples=60, deadline=None)
@given(fleets())
def test_every_request_is_recorded_once_by_one_replica(case: tuple[int, str, list[Request]]) -> None:
    n, name, reqs = case
    schedulers = [make_scheduler(max_num_seqs=3, num_blocks=24, block_size=16) for _ in range(n)]
    run = run_fleet(schedulers, [OneSecondCosts()] * n, make_router(name, n), reqs)
    assert [r.request_id for r in run.records] == [r.request_id for r in reqs]  # arrival order, once
    per_replica = [sorted(rec.request_id for rec in r.records) for r in run.runs]
    assert sorted(i for ids in per_replica for i in ids) == sorted(r.request_id for r in reqs)
    assert all(not s.has_unfinished_requests() for s in schedulers)
    assert all(s.block_manager.num_used_blocks == 0 for s in schedulers)
    assert sum(run.itl.counts) == sum(max(0, r.num_output_tokens - 1) for r in run.records)


def test_one_replica_behind_any_router_is_the_single_run() -> None:
    from stallfree.sim.traffic import run_traffic

    reqs = [req(str(i), (i % 3, 7)) for i in range(10)]
    alone = run_traffic(make_scheduler(max_num_seqs=4), OneSecondCosts(), reqs)
    fleet = run_fleet(
        [make_scheduler(max_num_seqs=4)], [OneSecondCosts()], make_router("cache-aware", 1), reqs
    )
    assert fleet.records == alone.records and fleet.load_imbalance == 1.0


def test_a_routing_delay_shifts_one_replicas_whole_run_and_counts_in_ttft() -> None:
    import dataclasses

    reqs = [req(str(i), (i % 3, 7)) for i in range(8)]
    reqs = [dataclasses.replace(r, arrival_time_s=0.7 * i) for i, r in enumerate(reqs)]
    late = [dataclasses.replace(r, arrival_time_s=r.arrival_time_s + 0.25) for r in reqs]
    plain = run_fleet([make_scheduler(max_num_seqs=4)], [OneSecondCosts()], RoundRobin(), late)
    delayed = run_fleet(
        [make_scheduler(max_num_seqs=4)], [OneSecondCosts()], RoundRobin(), reqs, route_delay_s=0.25
    )
    for a, b in zip(delayed.records, plain.records, strict=True):
        assert a.arrival_s == b.arrival_s - 0.25  # the client's arrival
        assert (a.first_token_s, a.finish_s) == (b.first_token_s, b.finish_s)


@settings(max_examples=30, deadline=None)
@given(fleets(), st.floats(0.01, 3))
def test_a_delayed_fleet_loses_no_request(case: tuple[int, str, list[Request]], delay_s: float) -> None:
    n, name, reqs = case
    schedulers = [make_scheduler(max_num_seqs=3, num_blocks=24, block_size=16) for _ in range(n)]
    run = run_fleet(schedulers, [OneSecondCosts()] * n, make_router(name, n), reqs, route_delay_s=delay_s)
    assert [r.request_id for r in run.records] == [r.request_id for r in reqs]
    done = [r for r in run.records if r.first_token_s is not None]
    assert all(r.first_token_s - r.arrival_s >= delay_s for r in done)  # type: ignore[operator]
