"""The parity replay hands each replayed step's worker output to the scheduler
where the recording's vLLM did: after the step (synchronous scheduling) or
after the next step was built (asynchronous, vLLM 0.34's default on CUDA)."""

from pipeline.parity.replay import _Unreported

SAVED = {"saved": [3], "failed_saves": [], "loaded": [], "failed_loads": [], "quarantined": []}
LOADED = {"saved": [], "failed_saves": [], "loaded": [7], "failed_loads": [], "quarantined": []}


def play(lag: int, events: list[tuple]) -> list[tuple[str, list]]:
    """events: ("build", output, live meta) or ("update", said); what reaches the scheduler, and where."""
    outputs, reached = _Unreported(lag), []
    for n, ev in enumerate(events):
        if ev[0] == "build":
            reached += [(f"build {n}", o) for o in outputs.before_build()]
            outputs.add(ev[1], ev[2])
        else:
            reached += [(f"update {n}", o) for o in outputs.at_update(ev[1])]
    return reached


def test_synchronous_each_update_takes_the_step_just_run_and_a_step_without_one_goes_before_the_next_build():
    events = [("build", "out0", SAVED), ("update", SAVED), ("build", "out1", None), ("build", "out2", LOADED)]
    events += [("update", LOADED)]
    assert play(0, events) == [("update 1", "out0"), ("build 3", "out1"), ("update 4", "out2")]


def test_asynchronous_an_update_after_the_next_build_takes_the_older_step():
    # vLLM builds step 1 before it updates with step 0's output.
    events = [("build", "out0", SAVED), ("build", "out1", LOADED), ("update", SAVED)]
    events += [("build", "out2", None), ("update", LOADED)]
    assert play(1, events) == [("update 2", "out0"), ("update 4", "out1")]


def test_asynchronous_a_step_that_got_no_update_goes_in_once_a_younger_one_waits():
    events = [("build", "out0", SAVED), ("build", None, None), ("update", SAVED), ("build", "out2", LOADED)]
    events += [("build", "out3", None), ("update", LOADED)]
    # Step 1 output nothing; step 2's output waits for its update, not for step 3's build.
    assert play(1, events) == [("update 2", "out0"), ("update 5", "out2")]


def test_asynchronous_at_the_end_the_update_names_its_step_past_an_older_one_without_update():
    # The run drains: steps 0 and 1 wait, step 0 got no update, step 1's comes.
    events = [("build", "out0", None), ("build", "out1", SAVED), ("update", SAVED)]
    assert play(1, events) == [("update 2", "out0"), ("update 2", "out1")]


def test_the_old_behaviour_the_update_takes_the_oldest_when_none_matches():
    # The replay diverged from the recording: its step said something else.
    events = [("build", "out0", SAVED), ("build", "out1", LOADED), ("update", {"saved": [9]})]
    assert play(1, events) == [("update 2", "out0")]


def test_recorded_blocks_go_back_into_their_ids_a_block_named_twice_keeps_its_last_copy():
    import torch

    from pipeline.parity.replay import _put_blocks

    layer = torch.zeros(5, 2)
    blocks = torch.arange(6, dtype=torch.float32).reshape(3, 2)
    _put_blocks(layer, [4, 0, 2], blocks)
    assert layer.tolist() == [[2, 3], [0, 0], [4, 5], [0, 0], [0, 1]]
    _put_blocks(layer, [1, 1], blocks[:2])
    assert layer[1].tolist() == [2, 3]
    _put_blocks(layer, [], None)  # a step that saves nothing
    assert layer.tolist() == [[2, 3], [2, 3], [4, 5], [0, 0], [0, 1]]
