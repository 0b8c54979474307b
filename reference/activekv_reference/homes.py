"""Layer streaming: which host row holds each block's streamed layers.

The workers keep every streamed layer's blocks in *home rows* on the host
(streaming.py). A block gets a row when vLLM gives it new content (a *fresh*
block: newly allocated to a request and not one of vLLM's own prefix hits)
and keeps it until vLLM gives it new content again. So a block several
requests share through vLLM's prefix cache has one home, and a block vLLM
keeps cached after its request finished keeps its bytes.

Rows are given out per request in *extents*, so a request's blocks lie in
long runs of consecutive rows whatever block ids vLLM chose, and a step's
staging is a few long copies (the copy engine's, on a device) instead of one
per scattered block. A request's fresh blocks take the next rows of its
extent, each run of consecutive block ids in id order: vLLM hands a new
request the blocks of a finished one tail first, so its ids often run
backwards, and a copy moves consecutive rows to consecutive blocks only where
both ascend together (rows given in block-table order made every such block
a copy of its own). A new extent reserves max(extent, the rows the request
holds, the rows the step needs): a long request has few extents. It continues the
previous extent where the rows after it are free, else it takes the
smallest free run that fits (the lowest first), else the largest free run.
With no free row left, the largest reservation of another request gives up
its second half. A request's reservation ends when it finishes or is
resumed after preemption.

There are num_blocks + slack rows: every mapped row is a block's, so at
most num_blocks - 1 are mapped when a fresh block needs one, and the slack
keeps free runs for new extents while vLLM's freed blocks give theirs back.
The workers and the scheduler compute the same `rows_for(num_blocks)`.
"""

from __future__ import annotations

import bisect
import dataclasses


def extent_for(num_blocks: int) -> int:
    """The smallest extent: 64 blocks (4 MiB a layer at Llama-3-8B's 64 KiB
    blocks, long enough for the copy engine's peak), less on a small cache."""
    return max(2, min(64, num_blocks // 16))


def rows_for(num_blocks: int) -> int:
    """Home rows for a KV cache of num_blocks blocks: 1/16 of slack, and at
    least two extents."""
    return num_blocks + max(num_blocks // 16, 2 * extent_for(num_blocks))


def in_id_order(blocks: list[int]) -> list[int]:
    """`blocks` with each run of ids descending by one reversed: the order
    their rows are given in."""
    out: list[int] = []
    start = 0
    for i in range(1, len(blocks) + 1):
        if i == len(blocks) or blocks[i] != blocks[i - 1] - 1:
            out.extend(reversed(blocks[start:i]))
            start = i
    return out


@dataclasses.dataclass
class _Extent:
    next: int  # the request's next row
    end: int  # rows next .. end - 1 are reserved for it


class HomeRows:
    """Scheduler side: the home row of every block, given out in extents."""

    def __init__(self, num_blocks: int):
        self.num_blocks = num_blocks
        self.num_rows = rows_for(num_blocks)
        self.extent = extent_for(num_blocks)
        self._row_of: dict[int, int] = {}  # block id -> row
        self._block_at: dict[int, int] = {}  # row -> block id
        # Free rows (neither mapped nor reserved) as maximal runs: start -> end.
        self._free: dict[int, int] = {0: self.num_rows}
        self._free_starts: list[int] = [0]  # sorted
        self._extents: dict[str, _Extent] = {}
        self._held: dict[str, int] = {}  # rows given to the request so far

    # -- queries ----------------------------------------------------------------
    def row(self, block: int) -> int:
        """The home row of a block that has one (KeyError otherwise)."""
        return self._row_of[block]

    def has_row(self, block: int) -> bool:
        return block in self._row_of

    def rows(self, blocks) -> list[int]:
        return [self._row_of[b] for b in blocks]

    def free_runs(self) -> list[tuple[int, int]]:
        return [(s, self._free[s]) for s in self._free_starts]

    def reserved(self) -> dict[str, tuple[int, int]]:
        return {r: (e.next, e.end) for r, e in self._extents.items() if e.next < e.end}

    # -- changes ----------------------------------------------------------------
    def assign(self, req_id: str, fresh_blocks: list[int]) -> None:
        """Rows for a request's fresh blocks (in block-table order), each run
        of ids descending by one given its rows in id order."""
        for block in fresh_blocks:
            row = self._row_of.pop(block, None)
            if row is not None:
                del self._block_at[row]
                self._give_back(row, row + 1)
        for i, block in enumerate(in_id_order(fresh_blocks)):
            ext = self._extents.get(req_id)
            if ext is None or ext.next == ext.end:
                ext = self._new_extent(req_id, len(fresh_blocks) - i)
            row = ext.next
            ext.next += 1
            self._row_of[block] = row
            self._block_at[row] = block
            self._held[req_id] = self._held.get(req_id, 0) + 1

    def end_request(self, req_id: str) -> None:
        """The request finished, or starts over after preemption: its
        reservation ends (the rows of its blocks stay theirs)."""
        ext = self._extents.pop(req_id, None)
        if ext is not None and ext.next < ext.end:
            self._give_back(ext.next, ext.end)
        self._held.pop(req_id, None)

    # -- extents ----------------------------------------------------------------
    def _new_extent(self, req_id: str, needed: int) -> _Extent:
        old = self._extents.get(req_id)
        after = old.end if old is not None else None
        want = max(self.extent, self._held.get(req_id, 0), needed)
        if after is not None and after in self._free:  # continue the run
            start = after
        else:
            start = self._fitting_run(want)
            if start is None:
                self._reclaim(req_id)
                start = self._fitting_run(want)
        if start is None:
            raise AssertionError("home rows: no free row for a fresh block")
        end = min(self._free[start], start + want)
        self._take(start, end)
        ext = _Extent(next=start, end=end)
        self._extents[req_id] = ext
        return ext

    def _fitting_run(self, want: int) -> int | None:
        """The smallest free run of at least `want` rows (lowest start first),
        else the largest (lowest start first); None when no row is free."""
        fits, largest = None, None
        for s in self._free_starts:
            n = self._free[s] - s
            if n >= want and (fits is None or n < self._free[fits] - fits):
                fits = s
            if largest is None or n > self._free[largest] - largest:
                largest = s
        return fits if fits is not None else largest

    def _reclaim(self, req_id: str) -> None:
        """The largest reservation of another request (the first in request
        order among equals) gives up its second half, at least one row."""
        victim, size = None, 0
        for other, ext in self._extents.items():
            if other != req_id and ext.end - ext.next > size:
                victim, size = other, ext.end - ext.next
        if victim is None:
            return
        ext = self._extents[victim]
        keep = ext.next + size // 2
        self._give_back(keep, ext.end)
        ext.end = keep

    # -- free runs --------------------------------------------------------------
    def _take(self, start: int, end: int) -> None:
        """Rows start .. end - 1 from the front of the free run at start."""
        run_end = self._free.pop(start)
        self._free_starts.pop(bisect.bisect_left(self._free_starts, start))
        if end < run_end:
            self._free[end] = run_end
            bisect.insort(self._free_starts, end)

    def _give_back(self, start: int, end: int) -> None:
        """Rows start .. end - 1 are free again, merged with their neighbours."""
        i = bisect.bisect_left(self._free_starts, start)
        if i > 0 and self._free[self._free_starts[i - 1]] == start:  # joins the run before
            i -= 1
            start = self._free_starts[i]
        else:
            self._free_starts.insert(i, start)
        nxt = i + 1
        if nxt < len(self._free_starts) and self._free_starts[nxt] == end:  # and the run after
            end = self._free.pop(end)
            self._free_starts.pop(nxt)
        self._free[start] = end
