"""The attempt number every rank of a group agrees on, from joins in the agent's store."""

from __future__ import annotations

import pytest

from resumequal.train.distributed import attempt_from_joins


@pytest.mark.parametrize(
    ("joins", "world", "expected"),
    [(1, 2, 0), (2, 2, 0), (3, 2, 1), (4, 2, 1), (5, 2, 2), (4, 4, 0), (5, 4, 1), (1, 1, 0),
     (2, 1, 1)],
)
def test_joins_number_the_attempts(joins: int, world: int, expected: int) -> None:
    assert attempt_from_joins(joins, world, restart_count=0) == expected


def test_a_recreated_pod_agrees_with_the_surviving_ranks() -> None:
    # World 4 on two pods: pod 1 was deleted and recreated, its agent counts from 0 again
    # while worker-0's agent restarted once. Joins 5..8 come from both pods in any order.
    survivors = [attempt_from_joins(j, 4, restart_count=1) for j in (5, 7)]
    recreated = [attempt_from_joins(j, 4, restart_count=0) for j in (6, 8)]
    assert survivors == recreated == [1, 1]


def test_a_store_younger_than_the_agent_falls_back_to_the_restart_count() -> None:
    assert attempt_from_joins(1, 2, restart_count=2) == 2
