"""The target errors' names: ``Target*Error`` are the classes; the ``Influx*Error`` names
they had while InfluxDB was the only kind of target are the same classes, each use
warning until they go, and twophase itself never uses them."""

from __future__ import annotations

import re
import warnings
from types import ModuleType

import pytest

import twophase
from tests.support import REPO
from twophase import errors
from twophase.errors import (
    FORMER_NAMES,
    TARGET_FAILURES,
    PermanentError,
    RetryableError,
    TargetAuthError,
    TargetNotFoundError,
    TargetRequestError,
    TargetUnavailableError,
)

RENAMED = {
    "InfluxUnavailableError": TargetUnavailableError,
    "InfluxAuthError": TargetAuthError,
    "InfluxNotFoundError": TargetNotFoundError,
    "InfluxRequestError": TargetRequestError,
}
FORMER = re.compile(r"\bInflux(?:Unavailable|Auth|NotFound|Request)Error\b")


def test_the_former_names_are_these_four() -> None:
    assert FORMER_NAMES == RENAMED


def test_the_target_errors_keep_their_place_in_the_hierarchy() -> None:
    assert issubclass(TargetUnavailableError, RetryableError)
    for permanent in (TargetAuthError, TargetNotFoundError, TargetRequestError):
        assert issubclass(permanent, PermanentError)
    assert {TargetUnavailableError, TargetAuthError, TargetNotFoundError} <= {*TARGET_FAILURES}
    assert TargetRequestError in TARGET_FAILURES


@pytest.mark.parametrize("module", [errors, twophase], ids=["twophase.errors", "twophase"])
@pytest.mark.parametrize("former", sorted(RENAMED))
def test_a_former_name_warns_and_is_the_same_class(module: ModuleType, former: str) -> None:
    current = RENAMED[former]
    with pytest.warns(DeprecationWarning) as caught:
        value = getattr(module, former)
    assert value is current
    (warning,) = caught
    assert str(warning.message) == (
        f"{module.__name__}.{former} is deprecated and goes in twophase 0.12.0: "
        f"use {current.__name__} (the same class)"
    )
    assert warning.filename == __file__  # the code that used the name, for the filters


def test_a_former_name_imports_with_a_warning() -> None:
    with pytest.warns(DeprecationWarning, match="use TargetAuthError") as caught:
        from twophase.errors import InfluxAuthError
    assert InfluxAuthError is TargetAuthError
    assert caught[0].filename == __file__


def test_a_former_name_catches_what_is_raised_under_the_current_one() -> None:
    with pytest.warns(DeprecationWarning):
        former = errors.InfluxUnavailableError
    with pytest.raises(former):
        raise TargetUnavailableError("down")


def test_the_current_names_warn_of_nothing() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for current in RENAMED.values():
            assert getattr(errors, current.__name__) is current
        assert twophase.TargetUnavailableError is TargetUnavailableError  # the one exported


@pytest.mark.parametrize("module", [errors, twophase], ids=["twophase.errors", "twophase"])
def test_an_unknown_name_is_still_an_attribute_error(module: ModuleType) -> None:
    with pytest.raises(AttributeError, match=r"has no attribute 'InfluxError'"):
        getattr(module, "InfluxError")  # noqa: B009


def test_the_former_names_are_neither_listed_nor_exported() -> None:
    assert not set(RENAMED) & {*twophase.__all__, *dir(twophase), *dir(errors)}


def test_twophase_itself_uses_no_former_name() -> None:
    """Outside the table of former names, so that no use inside the package warns."""
    table = re.compile(r"^FORMER_NAMES: .*?^\}$", re.M | re.S)
    used = []
    for path in sorted((REPO / "twophase").rglob("*.py")):
        text = path.read_text()
        if path == REPO / "twophase" / "errors.py":
            text = table.sub("", text, count=1)
        used += [f"{path.relative_to(REPO)}: {m}" for m in FORMER.findall(text)]
    assert used == []
