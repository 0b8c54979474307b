"""The reference connector with each streaming step's staging counted, for
bench.staging_copies (never shipped). The reference decides the
same home rows as the native engine (homes.py mirrors home_rows.h).

Per step with blocks to stage, in STEPS: the blocks, the copies their staging
takes (runs of consecutive home rows whose block ids are consecutive too: one
copy each where a copy moves rows straight to vLLM's blocks), and the copies
the same blocks would take had every request's rows been given in block-table
order, as before rows followed the ids (a shadow HomeRows fed the same
assignments), and the runs of consecutive ids among them: the fewest copies
any rows could give, and those within each request's blocks, the fewest rows
reserved per request could give.

Load it in vLLM with kv_connector="StagingCountingReferenceConnector",
kv_connector_module_path="pipeline.vllm_driver.staging_counter", in this process
(llm.make_llm's in_process, the default for one worker on CPU).
"""

from __future__ import annotations

import itertools

from activekv_reference import ActiveKVReferenceConnector
from activekv_reference.homes import HomeRows

STEPS: list[dict[str, int]] = []


def copies(pairs: list[tuple[int, int]]) -> int:
    """Copies for (row, block) pairs: runs where both step by one, in row order."""
    pairs = sorted(pairs)
    return len(pairs) - sum(1 for (r, b), (r2, b2) in itertools.pairwise(pairs) if (r2, b2) == (r + 1, b + 1))


class StagingCountingReferenceConnector(ActiveKVReferenceConnector):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._shadow: HomeRows | None = None  # the scheduler's side, streaming
        side = self.scheduler_side
        homes = side.homes if side is not None else None
        if homes is None:
            return
        # Ids 2b are never consecutive, so the shadow gives rows in the order
        # it is handed the blocks: block-table order.
        shadow = HomeRows(homes.num_blocks)
        self._shadow = shadow
        assign, end_request = homes.assign, homes.end_request

        def assigning(req_id, fresh_blocks):
            assign(req_id, fresh_blocks)
            shadow.assign(req_id, [2 * b for b in fresh_blocks])

        def ending(req_id):
            end_request(req_id)
            shadow.end_request(req_id)

        homes.assign, homes.end_request = assigning, ending

    def _runs_per_request(self, blocks) -> int:
        """Runs of consecutive ids within each request's staged blocks: the
        fewest copies rows reserved per request allow."""
        staged = set(blocks)
        runs = 0
        for table in self.scheduler_side._block_tables.values():
            mine = [b for b in table if b in staged]
            staged.difference_update(mine)  # a block shared by requests counts once
            runs += copies([(b, b) for b in mine])
        return runs + copies([(b, b) for b in staged])

    def build_connector_meta(self, scheduler_output):
        meta = super().build_connector_meta(scheduler_output)
        blocks = getattr(meta, "stage_blocks", None)
        if blocks and self._shadow is not None:
            STEPS.append(
                {
                    "blocks": len(blocks),
                    "copies": copies(list(zip(meta.stage_rows, blocks, strict=True))),
                    "copies_rows_in_table_order": copies([(self._shadow.row(2 * b), b) for b in blocks]),
                    "runs_of_ids": copies([(b, b) for b in blocks]),  # the fewest copies any rows allow
                    "runs_of_ids_per_request": self._runs_per_request(blocks),
                }
            )
        return meta
