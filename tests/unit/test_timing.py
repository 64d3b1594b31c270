"""kube32.timing: the timings tied to each other stay tied, and each is used from there."""
from __future__ import annotations

from kube32 import testing, timing


def test_a_prefetched_restore_outlives_the_rollback_timeout() -> None:
    assert timing.PREFETCH_UNCLAIMED_SECONDS > timing.MOVE_ROLLBACK_SECONDS


def test_a_kubelet_data_wait_ends_before_the_api_servers_limit() -> None:
    assert timing.PREFETCH_DATA_WAIT_SECONDS < timing.DATA_WAIT_MAX_SECONDS


def test_an_event_hold_outlives_every_part_of_a_move() -> None:
    assert timing.EVENT_HOLD_SECONDS > timing.MOVE_ROLLBACK_SECONDS
    assert timing.EVENT_HOLD_SECONDS > timing.FROZEN_MAX_SECONDS


def test_the_frozen_report_comes_within_the_specs_two_seconds() -> None:
    assert 0 < timing.FROZEN_REPORT_DELAY < 2.0


def test_a_slow_snapshot_still_arrives() -> None:
    """The slow-snapshots fault pauses less than the stall after which a snapshot is cut."""
    assert testing.SLOW_SNAPSHOT_PAUSE < timing.SNAPSHOT_STALL_SECONDS


def test_a_node_has_time_to_begin_a_snapshot_it_froze_in_time() -> None:
    """The API server waits for a node's answer longer than the node's own waits before it."""
    assert timing.SNAPSHOT_ANSWER_SECONDS > timing.EVENTS_SEQ_WAIT
    assert 0 < timing.FREEZE_TRY_SECONDS < timing.FREEZE_TIMEOUT_SECONDS <= timing.FREEZE_TIMEOUT_MAX_SECONDS


def test_a_forgotten_freeze_is_thawed_about_when_it_is_due() -> None:
    assert 0 < timing.THAW_SWEEP_SECONDS < timing.FROZEN_MAX_SECONDS


def test_a_node_is_stopped_only_after_its_drain() -> None:
    from kube32.sim import node, up
    assert timing.NODE_STOP_SECONDS > timing.DRAIN_SECONDS
    assert up.STOP_TIMEOUT == node.STOP_SECONDS == timing.NODE_STOP_SECONDS


def test_a_pre_pull_waits_for_the_nodes_own_pull() -> None:
    from kube32.controllers import imagecheck
    assert imagecheck.PULL_TIMEOUT_SECONDS >= timing.IMAGE_PULL_SECONDS


def test_the_moving_write_waits_less_than_a_held_moving_status() -> None:
    assert timing.MOVING_WRITE_DELAY < testing.HOLD_MOVING_SECONDS


def test_no_other_module_sets_these_timings_itself() -> None:
    """A timing of kube32.timing is defined there alone: elsewhere a module names it."""
    import ast
    from pathlib import Path

    import kube32
    names = {n for n in vars(timing) if n.isupper()}
    root = Path(kube32.__file__).parent
    for path in root.rglob("*.py"):
        if path.name == "timing.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, ast.Constant):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for t in targets:
                    assert not (isinstance(t, ast.Name) and t.id in names), \
                        f"{path.relative_to(root.parent)}:{node.lineno} sets {t.id}; kube32.timing has it"


def test_a_restore_stuck_in_its_start_fails_before_its_move_rolls_back() -> None:
    assert timing.START_TIMEOUT_SECONDS < timing.MOVE_ROLLBACK_SECONDS
