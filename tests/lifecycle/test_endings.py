"""The one table of what happens when an attempt (or a worker group) ends: complete, consistent, and the table its
module's docstring shows."""

from __future__ import annotations

import pytest

from raytrain.lifecycle import endings
from raytrain.lifecycle.endings import REACTIONS, Ending


def test_every_ending_has_a_reaction():
    assert set(REACTIONS) == set(Ending)


@pytest.mark.parametrize("ending", list(Ending))
def test_the_docstring_table_names_every_ending(ending):
    assert f"| {ending.name}" in endings.__doc__


@pytest.mark.parametrize("ending, checkpoint, commits, group, result", [
    (Ending.STOPPED, True, True, "ends", Ending.STOPPED),  # no step lost on SIGTERM or a deleted pod
    (Ending.LEASE_LOST, False, False, "ends", None),  # a newer attempt owns the run: write nothing more
    (Ending.DRAINING, True, True, "restarts", Ending.STOPPED),  # Ray Train starts a new group on the nodes left
    (Ending.RESIZING, True, True, "holds", Ending.STOPPED),  # Ray Train replaces the group
    (Ending.SUCCEEDED, False, True, "ends", Ending.SUCCEEDED),
    (Ending.FAILED, False, True, "restarts", Ending.FAILED),
])
def test_what_each_ending_does(ending, checkpoint, commits, group, result):
    reaction = REACTIONS[ending]
    assert (reaction.checkpoint, reaction.commits, reaction.group, reaction.result) == (checkpoint, commits, group,
                                                                                        result)


def test_only_an_ending_that_may_commit_checkpoints_first():
    assert all(r.commits for r in REACTIONS.values() if r.checkpoint)
