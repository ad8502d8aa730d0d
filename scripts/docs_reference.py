"""The generated parts of the documentation site, drawn from the code itself.

Each function returns Markdown. The site's pages hold a marker line such as
``<!-- generated: settings -->``; the MkDocs hook (``scripts/mkdocs_hooks.py``) replaces
it by what :data:`GENERATORS` gives for that name, so a setting, a command, a table, an
error or an alert added to the code appears in the reference without anyone copying it.

* ``settings``: every setting of ``twophase.config.SETTINGS`` (``twophase.config.settings``);
* ``per-target``: the settings one target may override;
* ``cli``: every command of the parser (``twophase.cli.parser.build_parser``);
* ``schema``, ``migrations``: the staging tables from the SQLAlchemy metadata
  (``twophase.store.schema``), the revisions from the shipped migrations;
* ``errors``, ``exit-codes``: the exception hierarchy (``twophase.errors``) and the CLI's
  exit codes (``twophase.cli.commands``);
* ``metrics``, ``alerts``: what the exporter and the driver expose, and the alert rules
  (``deploy/prometheus/alerts.yml``) with a link to each runbook page;
* ``grants``: what each role of least privilege may do in the staging schema
  (``twophase.store.least_privilege``);
* ``public-api``: a mkdocstrings block per name of ``twophase.__all__``, and the Spark
  integration's names.

``python -m scripts.docs_reference NAME`` prints one of them.
"""

from __future__ import annotations

import argparse
import ast
import inspect
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
ALERTS = REPO / "deploy" / "prometheus" / "alerts.yml"
RUNBOOKS = DOCS / "operations" / "runbooks"
# Where each alert's runbook_url points, after the base: the page's address on the site.
RUNBOOK_PATH = "operations/runbooks/{name}/"


def _cell(text: object) -> str:
    """Text fit for a Markdown table cell."""
    return str(text).replace("|", "\\|").replace("\n", " ")


def _text(text: str) -> str:
    """Prose from the code, with brackets that Markdown would read as a link escaped."""
    return text.replace("[", "\\[").replace("]", "\\]")


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


# --- settings ---------------------------------------------------------------------------


def format_duration(seconds: float) -> str:
    """A duration as the settings accept it: ``604800`` -> ``7d``, ``0.5`` -> ``0.5s``."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"


def format_default(setting: Any) -> str:
    if setting.required:
        return "required"
    value = setting.default
    if value is None:
        return "none"
    if setting.kind == "duration":
        return f"`{format_duration(float(value))}`"
    if setting.kind == "bool":
        return f"`{str(value).lower()}`"
    if setting.kind == "int" and value >= 1024 * 1024 and value % (1024 * 1024) == 0:
        return f"`{value}` ({value // (1024 * 1024)} MiB)"
    return f"`{value}`"


def _setting_meaning(setting: Any) -> str:
    meaning = _text(setting.help)
    extra = []
    if setting.choices:
        extra.append("one of " + ", ".join(f"`{c}`" for c in setting.choices))
    if setting.kind in ("int", "duration") and (setting.minimum or setting.maximum):
        shown = format_duration if setting.kind == "duration" else "{:g}".format
        bounds = f"at least {shown(setting.minimum)}"
        if setting.maximum is not None:
            bounds = f"{shown(setting.minimum)} to {shown(setting.maximum)}"
        extra.append(bounds)
    if setting.secret:
        extra.append(f"a secret: from the environment, `{setting.env}_FILE` or the file only")
    if setting.flag:
        extra.append(f"CLI flag `{setting.cli_flag}`")
    if setting.aliases:
        extra.append("former name, still read: " + ", ".join(_alias(a) for a in setting.aliases))
    return meaning + (f" ({'; '.join(extra)})" if extra else "")


def _alias(alias: str) -> str:
    """A former option name with its variable (``influx_url``, ``TWOPHASE_INFLUX_URL``)."""
    from twophase.config import env_name

    return f"`{alias}` (`{env_name(alias)}`)"


KINDS = {
    "text": "text",
    "secret": "secret",
    "duration": "duration",
    "int": "integer",
    "bool": "boolean",
    "choice": "choice",
    "staging_url": "URL",
    "http_url": "URL",
    "targets": "targets",
    "path": "file",
}


def settings() -> str:
    from twophase.config import SETTINGS

    sections: dict[str, list[Any]] = {}
    for setting in SETTINGS:
        sections.setdefault(setting.section, []).append(setting)
    titles = {
        "staging": "The staging store",
        "target": "Targets and promotion",
        "postgresql": "PostgreSQL targets",
        "influxdb": "InfluxDB targets",
        "points": "Rows to points",
        "exporter": "The exporter (`twophase metrics serve`)",
    }
    out = []
    for section, members in sections.items():
        out.append(f"### {titles.get(section, section)}\n")
        rows = [
            (
                f"`{s.name}`",
                f"`{s.env}`",
                KINDS.get(s.kind, s.kind),
                format_default(s),
                _setting_meaning(s),
            )
            for s in members
        ]
        out.append(_table(("option", "variable", "kind", "default", "meaning"), rows))
    return "\n".join(out)


def per_target() -> str:
    from twophase.config import PER_TARGET, SETTINGS, target_env_name

    rows = [
        (
            f"`{s.name}`",
            f"`{target_env_name('NAME', s.name)}`",
            ", ".join(f"`{target_env_name('NAME', a)}`" for a in s.aliases),
        )
        for s in SETTINGS
        if s.name in PER_TARGET
    ]
    return _table(("option", "one target's variable (target `NAME`)", "former name"), rows)


# --- the command line -------------------------------------------------------------------


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def commands() -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """``("twophase status", parser)`` for every command and action, in the parser's order."""
    from twophase.cli.parser import build_parser

    def walk(prefix: str, parser: argparse.ArgumentParser) -> Iterator[Any]:
        for name, sub in _subcommands(parser).items():
            path = f"{prefix} {name}"
            yield path, sub
            yield from walk(path, sub)

    yield from walk("twophase", build_parser())


def _flags(action: argparse.Action) -> str:
    if not action.option_strings:
        return f"`{action.metavar or action.dest}`"
    metavar = ""
    if action.nargs != 0:
        metavar = " " + str(action.metavar or action.dest.upper())
    return ", ".join(f"`{flag}{metavar}`" for flag in action.option_strings)


def _help(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    if not action.help or action.help == argparse.SUPPRESS:
        return ""
    return _text(parser._get_formatter()._expand_help(action))  # %(default)s and the like


def _connection_dests() -> set[str]:
    from twophase.config import BY_NAME, CLI_ALIASES, CLI_FLAGS

    return {BY_NAME[name].name for name in CLI_FLAGS} | set(CLI_ALIASES)


def _command_section(path: str, parser: argparse.ArgumentParser) -> str:
    from twophase.config import BY_NAME, STAGING

    connection = _connection_dests()
    common = {"help", "json", "debug", "log_format"}
    depth = "##" if path.count(" ") == 1 else "###"
    usage = parser.format_usage().replace("usage: ", "").strip()
    usage = re.sub(r"\s+", " ", usage)
    out = [f"{depth} `{path}`\n", (parser.description or "").strip() + "\n"]
    out.append(f"```text\n{usage}\n```\n")
    rows = []
    talks_to = set()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            names = ", ".join(f"`{n}`" for n in action.choices)
            rows.append(("`ACTION`", f"one of {names}"))
            continue
        if action.dest in connection:
            talks_to.add("staging" if BY_NAME[action.dest].section == STAGING else "targets")
            continue
        if action.dest in common:
            continue
        rows.append((_flags(action), _help(parser, action)))
    if rows:
        out.append(_table(("argument", "meaning"), rows))
    if talks_to:
        servers = "the staging store"
        if "targets" in talks_to:
            servers += " and the targets"
        out.append(f"Talks to {servers}: takes their [connection flags](#connection-flags).\n")
    if parser.epilog:
        out.append(parser.epilog.strip() + "\n")
    return "\n".join(out)


def cli() -> str:
    from twophase.cli.parser import build_parser

    top = build_parser()
    rows = []
    for action in top._actions:
        if action.option_strings and action.dest not in ("help",):
            rows.append((_flags(action), _help(top, action)))
    out = [
        "## Flags of every command\n",
        "Given before the command, or after it for the servers the command talks to.\n",
        "### Connection flags\n",
        _table(("flag", "meaning"), [r for r in rows if _flag_of(r) in _cli_flags()]),
        "### Output flags\n",
        _table(("flag", "meaning"), [r for r in rows if _flag_of(r) not in _cli_flags()]),
    ]
    out += [_command_section(path, parser) for path, parser in commands()]
    return "\n".join(out)


def _flag_of(row: tuple[str, ...]) -> str:
    return row[0].split()[0].strip("`,")


def _cli_flags() -> set[str]:
    from twophase.config import BY_NAME, CLI_ALIASES, CLI_FLAGS

    return {BY_NAME[name].cli_flag for name in CLI_FLAGS} | {
        "--" + alias.replace("_", "-") for alias in CLI_ALIASES
    }


# --- the staging schema -----------------------------------------------------------------


def _table_notes() -> dict[str, str]:
    """Each table's bullet in the schema module's docstring."""
    from twophase.store import schema

    notes: dict[str, str] = {}
    doc = inspect.getdoc(schema) or ""
    for item in re.split(r"\n(?=\* )", doc):
        found = re.match(r"\* ``(twophase_\w+)``:\s*(.*)", item, flags=re.S)
        if found:
            notes[found.group(1)] = re.sub(r"\s+", " ", found.group(2)).strip()
    return notes


def _rst_to_md(text: str) -> str:
    text = re.sub(r":\w+:`~?([\w.]+)`", r"`\1`", text)
    return text.replace("``", "`")


def schema() -> str:
    from sqlalchemy.dialects import postgresql

    from twophase.store.schema import SCHEMA_REVISION, VERSION_TABLE, metadata

    notes = _table_notes()
    out = [
        f"The code needs revision `{SCHEMA_REVISION}`; Alembic records the store's in "
        f"`{VERSION_TABLE}`.\n"
    ]
    for table in metadata.sorted_tables:
        out.append(f"### `{table.name}`\n")
        if table.name in notes:
            out.append(_rst_to_md(notes[table.name]) + "\n")
        rows = []
        for column in table.columns:
            default = ""
            if column.server_default is not None:
                arg = getattr(column.server_default, "arg", "")
                text = str(getattr(arg, "text", arg))
                default = f"`{text}`" if text else "`''`"
            rows.append(
                (
                    f"`{column.name}`",
                    f"`{column.type.compile(dialect=postgresql.dialect())}`",
                    "key" if column.primary_key else ("null" if column.nullable else "not null"),
                    default,
                    column.comment or "",
                )
            )
        out.append(_table(("column", "type", "", "default", "note"), rows))
    return "\n".join(out)


def migrations() -> str:
    versions = REPO / "migrations" / "versions"
    found = []
    for path in sorted(versions.glob("*.py")):
        tree = ast.parse(path.read_text())
        doc = ast.get_docstring(tree) or ""
        values = {
            target.id: node.value.value
            for node in tree.body
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
            for target in node.targets
            if isinstance(target, ast.Name)
        }
        title, _, body = doc.partition("\n")
        body = re.sub(r"^(Revision ID|Revises|Create Date):.*$", "", body, flags=re.M).strip()
        found.append((values.get("revision", path.stem), title.strip(), body))
    out = []
    for revision, title, body in found:
        out.append(f"### `{revision}`: {title}\n")
        if body:
            out.append(_rst_to_md(body) + "\n")
    return "\n".join(out)


# --- errors and exit codes --------------------------------------------------------------


def errors() -> str:
    from twophase import errors as module

    classes = [
        obj
        for _, obj in inspect.getmembers(module, inspect.isclass)
        if obj.__module__ == module.__name__ and issubclass(obj, module.TwoPhaseError)
    ]

    def children(base: type) -> list[type]:
        kids = [c for c in classes if base in c.__bases__]
        return sorted(kids, key=lambda c: c.__name__)

    lines: list[str] = []

    def walk(cls: type, depth: int) -> None:
        doc = (inspect.getdoc(cls) or "").split("\n\n")[0].replace("\n", " ")
        lines.append(f"{'    ' * depth}- **`{cls.__name__}`**: {_rst_to_md(doc)}")
        for kid in children(cls):
            walk(kid, depth + 1)

    walk(module.TwoPhaseError, 0)
    return "\n".join(lines) + "\n"


def exit_codes() -> str:
    from twophase.cli import commands as cmd

    codes = {
        name: value
        for name, value in vars(cmd).items()
        if name.startswith("EXIT_") and isinstance(value, int)
    }
    meanings = {
        "EXIT_OK": "success",
        "EXIT_FAILED": "a failure the one-line message explains (a server unreachable, a "
        "setting missing, a live run owning the sink, a declined confirmation)",
        "EXIT_USAGE": "wrong usage (bad flags, unknown sink, an epoch not recorded, a "
        "malformed duration, a revision that cannot work, a destructive command without "
        "`--yes` off a terminal)",
        "EXIT_DIFFERS": "`verify`: a target differs from what staging says was delivered",
        "EXIT_NO_ANSWER": "`verify`: no answer (wrong usage or any failure)",
    }
    rows = [
        (f"`{value}`", f"`{name}`", meanings.get(name, ""))
        for name, value in sorted(codes.items(), key=lambda kv: (kv[1], kv[0]))
    ]
    rows.append(("`130`", "", "interrupted (Ctrl-C)"))
    return _table(("code", "name in `twophase.cli.commands`", "meaning"), rows)


# --- operations -------------------------------------------------------------------------


def metrics() -> str:
    from prometheus_client import CollectorRegistry

    from twophase.operations.exporter import _Sample
    from twophase.targets import metering

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Sample())
    rows = []
    for family in registry.collect():
        labels = sorted({k for s in family.samples for k in s.labels} - {"le"})
        rows.append(("exporter", family, labels))
    for metric in metering.METRICS:
        for family in metric.collect():
            rows.append(("driver", family, list(metric._labelnames)))
    table = []
    for where, family, labels in rows:
        name = family.name + ("_total" if family.type == "counter" else "")
        label = "{" + ",".join(labels) + "}" if labels else ""
        table.append((f"`{name}{label}`", family.type, where, family.documentation or ""))
    return _table(("metric", "type", "served by", "meaning"), table)


def grants() -> str:
    """The grant table of the roles of least privilege (``twophase.store.least_privilege``)."""
    from twophase.store.least_privilege import GRANTS, ROLES

    rows = [
        (f"`{g.name}`", g.kind, *(", ".join(g.privileges(k)) or "-" for k in ROLES), g.why)
        for g in GRANTS
    ]
    return _table(("object", "kind", *ROLES, "why"), rows)


def alert_rules() -> list[dict[str, Any]]:
    import yaml

    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def runbook_page(alert: str) -> Path:
    """The source of an alert's runbook page."""
    return RUNBOOKS / f"{alert.lower()}.md"


def alerts() -> str:
    rows = [
        (
            f"[{rule['alert']}](runbooks/{rule['alert'].lower()}.md)",
            rule["labels"]["severity"],
            rule["annotations"]["summary"],
        )
        for rule in alert_rules()
    ]
    return _table(("alert", "severity", "summary"), rows)


# --- the Python API ---------------------------------------------------------------------


def _summary(obj: Any) -> str:
    doc = inspect.getdoc(obj) or ""
    return _rst_to_md(doc.split("\n\n")[0].replace("\n", " "))


def _api_rows(names: dict[str, str]) -> str:
    import importlib

    rows = []
    for name, home in names.items():
        obj = getattr(importlib.import_module(home), name)
        kind = "class" if inspect.isclass(obj) else "function" if callable(obj) else "value"
        rows.append((f"[`{name}`][{home}.{name}]", kind, _summary(obj)))
    return _table(("name", "kind", "what it is"), rows)


def public_api() -> str:
    """The names of ``twophase.__all__``, each linked to its documentation."""
    import twophase

    return _api_rows(dict(twophase._HOMES))


def spark_api() -> str:
    """The names of ``twophase.spark.__all__``, each linked to its documentation."""
    import twophase.spark

    names = {}
    for name in twophase.spark.__all__:
        module = twophase.spark._LAZY.get(name)
        names[name] = f"twophase.spark.{module}" if module else "twophase.spark"
    return _api_rows(names)


def api_modules() -> list[str]:
    """Every module of the package (the migrations are Alembic's scripts), sorted."""
    found = []
    for path in sorted((REPO / "twophase").rglob("*.py")):
        if "migrations" in path.parts:
            continue
        parts = list(path.relative_to(REPO).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found.append(".".join(parts))
    return found


def modules() -> str:
    """A link to each module's generated page (``reference/api/<module>.md``)."""
    rows = []
    for module in api_modules():
        tree = ast.parse(_module_path(module).read_text())
        summary = (ast.get_docstring(tree) or "").split("\n\n")[0].replace("\n", " ")
        rows.append((f"[`{module}`](api/{module}.md)", _rst_to_md(summary)))
    return _table(("module", "what it is"), rows)


def _module_path(module: str) -> Path:
    path = REPO.joinpath(*module.split("."))
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


def words() -> str:
    """The design's "Words" section (``docs/concepts/design.md``), without its heading."""
    design = (DOCS / "concepts" / "design.md").read_text()
    found = re.search(r"^## Words\n(.*?)(?=^## |\Z)", design, flags=re.M | re.S)
    if not found:
        raise ValueError("docs/concepts/design.md has no section 'Words'")
    return found.group(1).strip() + "\n"


GENERATORS: dict[str, Callable[[], str]] = {
    "settings": settings,
    "per-target": per_target,
    "cli": cli,
    "schema": schema,
    "migrations": migrations,
    "errors": errors,
    "exit-codes": exit_codes,
    "metrics": metrics,
    "grants": grants,
    "alerts": alerts,
    "public-api": public_api,
    "spark-api": spark_api,
    "words": words,
    "modules": modules,
}

MARKER = re.compile(r"^<!-- generated: ([\w-]+) -->$", flags=re.M)


def expand(markdown: str) -> str:
    """The page with each marker replaced by what its generator gives."""
    return MARKER.sub(lambda m: GENERATORS[m.group(1)]().rstrip("\n"), markdown)


if __name__ == "__main__":
    print(GENERATORS[sys.argv[1]]())
