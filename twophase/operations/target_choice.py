"""The target a command names (``--target``), picked from the configuration.

With several targets (``TWOPHASE_TARGETS``),
[`target_config`][twophase.operations.target_choice.target_config] picks one
by name (``verify --target``, ``resend --target``, ``targets resync``);
[`require_sink_target`][twophase.operations.target_choice.require_sink_target] refuses one the
sink does not have (never registered, or removed: ``resend --target``, ``targets remove``).
"""

from __future__ import annotations

from twophase.config import DEFAULT_TARGET, NamedTarget, TargetConfig, env_name
from twophase.errors import UsageError
from twophase.operations.hooks import Hooks
from twophase.protocol.commit.runtime import TwoPhase
from twophase.protocol.ledger.target_ledger import TargetLedger

# The variables that name a sink's several targets, and its one target's server.
TARGETS_ENV, URL_ENV = env_name("targets"), env_name("target_url")


def target_config(influx: TargetConfig, name: str) -> NamedTarget:
    """The configured target ``name``; UsageError naming the ones configured."""
    targets = influx.named_targets()
    for target in targets:
        if target.name == name:
            return target
    if not influx.targets:
        raise UsageError(
            f"unknown target {name!r}: this configuration names one target server ({URL_ENV}, "
            f"target {DEFAULT_TARGET!r}); a sink's several targets are named by {TARGETS_ENV}"
        )
    known = ", ".join(t.name for t in targets)
    raise UsageError(f"unknown target {name!r}: the configuration ({TARGETS_ENV}) names {known}")


def warn_unknown_targets(tp: TwoPhase, sink_id: str, hooks: Hooks) -> None:
    """Warn of each target the configuration names that the sink does not have: an
    operator's command leaves it alone (only the sink's query adds a target), so a
    misspelt name never becomes a target that holds retention."""
    for name in tp.roster.unknown(sink_id):
        hooks.warn(
            f"sink {sink_id}: target {name!r} of the configuration is not one of the sink's "
            "targets (a target is added by running the sink's query with it); left alone"
        )


def require_sink_target(ledger: TargetLedger, sink_id: str, target: str) -> None:
    """UsageError naming the sink's targets when ``target`` is not one of them."""
    names = [s.target for s in ledger.states(sink_id)]
    if target in names:
        return
    has = f"its targets: {', '.join(names)}" if names else "it has none"
    raise UsageError(
        f"sink {sink_id!r} has no target {target!r} ({has}): a target is registered by a "
        "run of the sink's query that names it, and `twophase targets remove` removes one; "
        f"`twophase targets --sink {sink_id}` lists them"
    )
