"""Home rows (reference/activekv_reference/homes.py): every block with content
has one row of its own, and a request's blocks lie in long runs of rows."""

import itertools
import random

import pytest

from activekv_reference.homes import HomeRows, extent_for, in_id_order, rows_for


def check_invariants(homes: HomeRows) -> None:
    """Mapped, reserved and free rows partition the rows; no row serves two blocks."""
    mapped = list(homes._row_of.values())
    assert len(set(mapped)) == len(mapped), "a row serves two blocks"
    assert all(homes._block_at[r] == b for b, r in homes._row_of.items())
    owner = {}
    for what, (start, end) in [
        *(("free", r) for r in homes.free_runs()),
        *(((req,), r) for req, r in homes.reserved().items()),
    ]:
        for row in range(start, end):
            assert row not in owner, f"row {row} is both {owner[row]} and {what}"
            owner[row] = what
    for row in mapped:
        assert row not in owner, f"mapped row {row} is also {owner[row]}"
    assert len(owner) + len(mapped) == homes.num_rows
    runs = homes.free_runs()
    assert all(a_end < b_start for (_, a_end), (b_start, _) in itertools.pairwise(runs)), (
        "free runs must be maximal (merged with their neighbours)"
    )


def runs_of(rows: list[int]) -> int:
    return 1 + sum(1 for a, b in itertools.pairwise(rows) if b != a + 1)


def copies_of(homes: HomeRows, blocks: list[int]) -> int:
    """Copies a staging of `blocks` takes: runs of consecutive rows whose
    block ids are consecutive too (the stage list is in row order)."""
    pairs = sorted((homes.row(b), b) for b in blocks)
    return 1 + sum(1 for (r, b), (r2, b2) in itertools.pairwise(pairs) if (r2, b2) != (r + 1, b + 1))


def test_sizes_follow_the_cache():
    assert extent_for(16) == 2 and extent_for(4096) == 64 and extent_for(1 << 20) == 64
    assert rows_for(16) == 16 + 4
    assert rows_for(65536) == 65536 + 4096


def test_a_growing_request_keeps_consecutive_rows_whatever_its_block_ids():
    homes = HomeRows(4096)
    ids = random.Random(1).sample(range(4096), 1000)
    homes.assign("a", ids[:100])  # the prompt
    for block in ids[100:]:  # decode, one block at a time
        homes.assign("a", [block])
        check_invariants(homes) if block % 97 == 0 else None
    check_invariants(homes)
    assert runs_of(homes.rows(ids)) == 1


def test_interleaved_requests_each_keep_long_runs():
    homes = HomeRows(4096)
    rng = random.Random(2)
    free = rng.sample(range(4096), 4096)
    tables = {r: [] for r in "abcd"}
    for _ in range(600):
        for req, table in tables.items():
            block = free.pop()
            homes.assign(req, [block])
            table.append(block)
    check_invariants(homes)
    for table in tables.values():
        rows = homes.rows(table)
        # Extents of 64, then as many rows as the request holds: 64+64+128+256+...
        assert runs_of(rows) <= 5, rows


def test_a_fresh_block_leaves_its_old_row_and_a_shared_one_keeps_it():
    homes = HomeRows(64)  # extents of 4
    homes.assign("a", [5, 6, 7])
    homes.assign("c", [8])  # rows past a's extent
    old = homes.rows([5, 6, 7])
    homes.end_request("a")
    # "b" hits 5 and 6 in vLLM's prefix cache (not fresh); vLLM gives block 7
    # new content for it.
    homes.assign("b", [7])
    assert homes.rows([5, 6]) == old[:2]
    assert homes.row(7) != old[2]
    check_invariants(homes)
    # The old row went back to the free rows.
    assert any(s <= old[2] < e for s, e in homes.free_runs())


def test_with_no_free_row_the_largest_other_reservation_gives_up_half():
    homes = HomeRows(16)  # 20 rows, extents of 2
    homes.assign("big", list(range(8)))  # reserves 8, uses 8
    homes.assign("big", [8])  # a new extent: max(2, 8 held) = 8 rows, one used
    homes.assign("other", list(range(9, 16)))  # 7 blocks; only 4 rows are free
    check_invariants(homes)
    assert len(homes._row_of) == 16
    # "big" kept the front half of its 7 reserved rows, less what "other" took.
    assert homes.reserved().get("big", (0, 0))[1] - homes.row(8) <= 4


def test_fragmentation_after_many_requests_keeps_every_invariant():
    """vLLM's way: blocks freed when a request ends are reused later (in
    reverse, tail first), some prefixes are shared; many requests over time."""
    num_blocks = 512
    homes = HomeRows(num_blocks)
    rng = random.Random(3)
    free = list(range(num_blocks))
    rng.shuffle(free)
    live: dict[str, list[int]] = {}
    cached_prefix: list[int] = []
    mean_runs = []
    for step in range(3000):
        if live and (rng.random() < 0.05 or not free):
            req = rng.choice(sorted(live))
            table = live.pop(req)
            homes.end_request(req)
            free.extend(reversed([b for b in table if b not in cached_prefix]))
            mean_runs.append(len(table) / runs_of(homes.rows(table)))
        elif len(live) < 8 and len(free) > 40:
            req = f"r{step}"
            shared = cached_prefix if cached_prefix and rng.random() < 0.3 else []
            n = rng.randint(1, 30)
            fresh = [free.pop(0) for _ in range(n)]
            homes.assign(req, fresh)
            live[req] = shared + fresh
            if not cached_prefix:
                cached_prefix = fresh[:4]
        else:
            for req in sorted(live):
                if free and rng.random() < 0.5:
                    block = free.pop(0)
                    homes.assign(req, [block])
                    live[req].append(block)
        if step % 100 == 0:
            check_invariants(homes)
    check_invariants(homes)
    # Requests of 1..~60 blocks: on average a run holds several blocks.
    assert sum(mean_runs) / len(mean_runs) >= 4, sum(mean_runs) / len(mean_runs)


def test_runs_of_ids_descending_by_one_are_given_rows_in_id_order():
    assert in_id_order([9, 8, 7, 3, 4, 5, 2, 1, 10]) == [7, 8, 9, 3, 4, 5, 1, 2, 10]
    assert in_id_order([]) == [] and in_id_order([4]) == [4] and in_id_order([6, 5]) == [5, 6]


def test_blocks_handed_out_tail_first_cross_in_one_copy_a_chunk():
    """vLLM frees a finished request's blocks tail first and hands them to
    the next request in that order: its prefill chunks get ids that run
    backwards. Each chunk's rows ascend with its ids, so it is one copy."""
    homes = HomeRows(4096)
    first = list(range(300))
    for chunk in range(0, 300, 100):
        homes.assign("first", first[chunk : chunk + 100])
    homes.end_request("first")
    free = list(reversed(first))  # vLLM's free queue after the request ended
    second = []
    for _ in range(3):
        chunk, free = free[:100], free[100:]
        homes.assign("second", chunk)
        second += chunk
    check_invariants(homes)
    assert copies_of(homes, second) == 3  # rows in block-table order: 300
    assert runs_of(sorted(homes.rows(second))) == 1  # still one run of rows


def test_a_long_running_server_stages_a_run_of_ids_in_about_one_copy():
    """vLLM's free queue (ids in order at start, a finished request's blocks
    appended tail first, new blocks taken from the front) through many long
    requests, prefilled in chunks and decoded a block at a time beside each
    other. The ids fragment (runs of about 16 blocks, either way); a staging
    takes about one copy per run of ids (0.78 of a run here; rows in
    block-table order took 0.42: a run handed out backwards was a copy a
    block)."""
    num_blocks = 4096
    homes = HomeRows(num_blocks)
    rng = random.Random(5)
    free = list(range(num_blocks))
    live: dict[str, list[int]] = {}
    blocks_per_copy, blocks_per_id_run = [], []
    for step in range(4000):
        if live and (rng.random() < 0.02 or len(free) < 200):
            req = rng.choice(sorted(live))
            table = live.pop(req)
            blocks_per_copy.append(len(table) / copies_of(homes, table))
            id_runs = 1 + sum(1 for a, b in itertools.pairwise(table) if abs(b - a) != 1)
            blocks_per_id_run.append(len(table) / id_runs)
            homes.end_request(req)
            free.extend(reversed(table))
        elif len(live) < 4:
            req = f"r{step}"
            live[req] = []
            for _ in range(rng.randint(1, 8)):  # chunks of 128 blocks (2048 tokens)
                chunk, free = free[:128], free[128:]
                homes.assign(req, chunk)
                live[req] += chunk
        else:
            for req in sorted(live):  # decode: a block now and then
                if rng.random() < 0.1:
                    block, free = free[0], free[1:]
                    homes.assign(req, [block])
                    live[req].append(block)
    check_invariants(homes)
    assert len(blocks_per_copy) > 50
    per_copy = sum(blocks_per_copy) / len(blocks_per_copy)
    per_id_run = sum(blocks_per_id_run) / len(blocks_per_id_run)
    assert per_copy >= 0.7 * per_id_run, (per_copy, per_id_run)


def test_a_block_without_a_row_is_a_key_error():
    with pytest.raises(KeyError):
        HomeRows(16).row(3)
