"""The stateful test's reference model (``tests/model``) on its own: what it says a
target holds after a few actions, worked out by hand."""

from __future__ import annotations

import pytest

from tests.model import COMMITTED, FAILED, PRECOMMITTED, REPLAY, SinkModel


def two_targets(min_targets: int = 1) -> SinkModel:
    model = SinkModel(min_targets=min_targets)
    model.add_target("a")
    model.add_target("b")
    return model


def test_an_epoch_is_decided_once_and_a_replay_changes_nothing() -> None:
    model = two_targets()
    assert model.commit(0, {"k": 1.0}) == COMMITTED
    assert model.commit(0, {"k": 9.0, "j": 2.0}) == REPLAY
    assert model.expected("a") == model.expected("b") == {"k": 1.0}


def test_the_last_write_of_a_key_wins_in_epoch_order() -> None:
    model = two_targets()
    model.commit(0, {"k": 1.0, "j": 1.0})
    model.commit(1, {"k": 2.0})
    assert model.expected("a") == {"k": 2.0, "j": 1.0}


def test_a_target_down_lags_and_is_caught_up_in_order() -> None:
    model = two_targets()
    model.set_up("b", False)
    model.commit(0, {"k": 1.0})
    model.commit(1, {"k": 2.0})
    assert model.expected("b") == {} and not model.caught_up("b")
    model.set_up("b", True)
    model.catch_up()
    assert model.expected("b") == {"k": 2.0} and model.caught_up("b")


def test_fewer_than_min_targets_up_leaves_the_epoch_precommitted_then_blocks() -> None:
    model = two_targets(min_targets=2)
    model.set_up("b", False)
    assert model.commit(0, {"k": 1.0}) == PRECOMMITTED
    assert model.expected("a") == {"k": 1.0}  # the targets that took it hold it
    assert model.commit(1, {"k": 2.0}) == FAILED  # recovery first, and it fails again
    assert 1 not in model.decided
    model.set_up("b", True)
    assert model.commit(1, {"k": 2.0}) == COMMITTED
    assert model.committed == {0, 1}


def test_dead_letters_and_their_requeue() -> None:
    model = two_targets()
    model.commit(0, {"k": 1.0, "bad": "x"})
    assert model.targets["a"].dead == {"bad": "x"}
    assert model.requeue("a")  # still refused: a letter again
    assert model.targets["a"].dead == {"bad": "x"} and model.corrections == 1
    model.targets["a"].strict = False
    assert model.requeue("a")
    assert model.expected("a") == {"k": 1.0, "bad": "x"} and not model.targets["a"].dead
    assert not model.requeue("a")


def test_a_reset_restarts_the_epochs_and_the_targets_keep_what_they_hold() -> None:
    model = two_targets()
    model.commit(0, {"k": 1.0, "j": 1.0})
    model.reset()
    assert model.commit(0, {"k": 5.0}) == COMMITTED  # not a replay: a new query
    assert model.expected("a") == {"k": 5.0, "j": 1.0}


def test_a_reset_is_refused_while_an_epoch_is_precommitted() -> None:
    model = two_targets(min_targets=2)
    model.set_up("b", False)
    model.commit(0, {"k": 1.0})
    with pytest.raises(ValueError, match="PRECOMMITTED"):
        model.reset()


def test_a_new_target_is_owed_the_epochs_after_the_last_committed() -> None:
    model = two_targets()
    model.commit(0, {"k": 1.0})
    model.add_target("c")
    model.catch_up()
    assert model.expected("c") == {}
    model.commit(1, {"j": 2.0})
    assert model.expected("c") == {"j": 2.0}


def test_a_renamed_target_keeps_its_store_and_the_old_name_holds_gc_back() -> None:
    model = two_targets()
    model.commit(0, {"k": 1.0, "bad": "x"})
    model.rename_target("a", "z")
    assert model.expected("z") == {"k": 1.0} and not model.targets["z"].dead
    assert model.targets["a"].dead == {"bad": "x"}  # its letters stay under the old name
    model.commit(1, {"k": 2.0})
    model.commit(2, {"k": 3.0})
    model.expire()
    assert model.floor() == 0  # the old name lacks 1: it holds the floor below it
    model.remove_target("a")
    model.expire()
    assert model.floor() == 1


def test_expiry_compacts_only_what_every_target_holds_and_keeps_the_last() -> None:
    model = two_targets()
    model.commit(0, {"k": 1.0})
    model.set_up("b", False)
    model.commit(1, {"k": 2.0})
    model.commit(2, {"k": 3.0})
    model.expire()
    assert model.floor() == 0 and model.purged == {0}
    model.set_up("b", True)
    model.catch_up()
    model.expire()
    assert model.floor() == 1 and model.purged == {0, 1, 2}  # epoch 2's record stays


def test_a_removed_target_holds_nothing_back() -> None:
    model = two_targets()
    model.add_target("c")
    model.set_up("c", False)
    model.commit(0, {"k": 1.0})
    model.commit(1, {"k": 2.0})
    model.expire()
    assert model.floor() is None
    model.remove_target("c")
    model.expire()
    assert model.floor() == 0


def test_resend_lands_what_a_target_now_takes() -> None:
    model = two_targets()
    model.commit(0, {"k": 1.0, "bad": "x"})
    model.targets["a"].strict = False
    assert model.resend(["a", "b"])
    assert model.expected("a") == {"k": 1.0, "bad": "x"}
    assert model.targets["a"].dead == {"bad": "x"}  # its letter stays listed
    assert model.expected("b") == {"k": 1.0}


def test_a_reset_forgets_a_name_no_longer_configured_and_keeps_its_letters() -> None:
    model = two_targets()
    model.commit(0, {"k": 1.0, "bad": "x"})
    model.rename_target("a", "z")
    model.reset()
    model.commit(0, {"k": 2.0})
    model.commit(1, {"k": 3.0})
    model.expire()
    assert model.floor() == 0  # the old name, forgotten by the reset, holds nothing back
    assert model.targets["a"].dead == {"bad": "x"}


def test_resend_stops_at_a_target_that_is_down_and_the_ones_after_it_get_nothing() -> None:
    model = two_targets()
    model.commit(0, {"k": 1.0})
    model.commit(1, {"k": 2.0})
    model.targets["a"].holds["k"] = 0.5  # lost and restored from an old backup
    model.targets["b"].holds["k"] = 0.5
    model.set_up("a", False)
    assert not model.resend(["b", "a"])
    assert model.expected("b") == {"k": 2.0}  # whole: epoch 1's value stands
    model.targets["b"].holds["k"] = 0.5
    assert not model.resend(["a", "b"])
    assert model.expected("b") == {"k": 0.5}  # after the target that is down: untouched
