"""The table of settings: every setting's option name, environment variable, kind, default and help.

[`SETTINGS`][twophase.config.settings.SETTINGS] is the single source of every setting.
Parsing ([`twophase.config.loading`][twophase.config.loading]), the CLI's connection flags
and the Spark sink's options are all derived from it, so a setting is defined in one place.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

ENV_PREFIX = "TWOPHASE_"
INFLUX_APIS = ("v1", "v2", "v3", "auto")
INLINE, BACKGROUND = "inline", "background"
PROMOTIONS = (INLINE, BACKGROUND)
GZIP, UNCOMPRESSED = "gzip", "none"
COMPRESSIONS = (GZIP, UNCOMPRESSED)
MAX_LANES = 32  # connections a target's writer keeps open (its pool's size)
# The most characters one staged chunk of several lines holds (4 bytes each at most in
# UTF-8): with the longest line staged, the bound a chunk's decompression keeps to.
MAX_CHUNK_CHARS = 16 * 1024 * 1024
STAGING = "staging"
# A target's settings: those of any kind, then those only one kind reads (its config's
# section of the same name).
TARGET, INFLUXDB, POSTGRESQL = "target", "influxdb", "postgresql"
TARGET_SECTIONS = (TARGET, INFLUXDB, POSTGRESQL)
# How rows become points: read by the point builder alone (no config object holds them).
POINTS = "points"
# The exporter of the store's metrics (`twophase metrics serve`): its ExporterConfig.
EXPORTER = "exporter"
# Where a Prometheus endpoint listens unless told: this host only. What it shows (sinks,
# runs, targets, errors) is the operator's, and each scrape of the exporter costs queries.
LOOPBACK = "127.0.0.1"
# The optional TOML file of settings (read below the environment, above the defaults).
CONFIG_FILE_ENV = ENV_PREFIX + "CONFIG"
# One target's override: TWOPHASE_TARGET_<NAME>_<OPTION>.
TARGET_ENV_PREFIX = ENV_PREFIX + "TARGET_"
# Lines per staged chunk; a promote request (target_batch_points) holds whole chunks.
_REQUEST_POINTS = 5000
# The longest PostgreSQL timeout these settings take: PostgreSQL's own are whole
# milliseconds in a 32-bit integer (just under 25 days), and 24 days is a round figure.
PG_MAX_TIMEOUT_S = 24 * 86400


def env_name(option: str) -> str:
    """The environment variable of an option: ``influx_db`` -> ``TWOPHASE_INFLUX_DB``."""
    return ENV_PREFIX + option.upper()


def target_env_key(target: str) -> str:
    """A target's name as its variables spell it: ``eu-west`` -> ``EU_WEST``."""
    return target.upper().replace("-", "_")


def target_env_name(target: str, option: str) -> str:
    """The variable of one target's override: (``eu-west``, ``influx_db``) ->
    ``TWOPHASE_TARGET_EU_WEST_INFLUX_DB``."""
    return f"{TARGET_ENV_PREFIX}{target_env_key(target)}_{option.upper()}"


@dataclass(frozen=True)
class Setting:
    """One setting: option ``name`` (lower case), its ``TWOPHASE_*`` variable, how to read it.

    ``kind`` is ``text``, ``secret``, ``duration`` (seconds; ``30s``, ``7d``),
    ``int``, ``bool`` (``true``/``false``), ``choice``, ``staging_url``,
    ``http_url``, ``targets`` (named http URLs: ``a=http://h1:8086,b=https://h2:8086``)
    or ``path`` (a readable file).
    ``attr`` is its field in [`StagingConfig`][twophase.config.sections.StagingConfig],
    [`TargetConfig`][twophase.config.sections.TargetConfig] or
    [`ExporterConfig`][twophase.config.sections.ExporterConfig] (``section``). ``flag``
    settings are also flags of the ``twophase`` CLI (``--influx-db``).
    ``aliases`` are its former option names (``influx_url`` of ``target_url``): each is
    read wherever the name is (option, variable, ``_FILE``, per-target variable, file
    key, CLI flag, Spark option), so configurations written before the rename work.
    ``removed`` are values of a ``choice`` a former version took: refused with an error
    that says so and names the choices left.
    """

    name: str
    section: str
    attr: str
    kind: str
    help: str
    default: Any = None
    required: bool = False
    flag: bool = False
    minimum: float = 0
    maximum: float | None = None
    choices: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    aliases: tuple[str, ...] = ()

    @property
    def env(self) -> str:
        return env_name(self.name)

    @property
    def names(self) -> tuple[str, ...]:
        """The option name, then its aliases: the order a conflict between them is told in."""
        return (self.name, *self.aliases)

    @property
    def secret(self) -> bool:
        return self.kind == "secret"

    @property
    def cli_flag(self) -> str:
        return "--" + self.name.replace("_", "-")


def _endpoint_settings(prefix: str, section: str, attr: str, what: str) -> tuple[Setting, ...]:
    """The address and TLS files of one Prometheus endpoint (``what``: the driver's, the
    exporter's), served by prometheus_client: the same settings for both, written once.
    ``attr`` starts their fields' names in the section's config."""
    return (
        Setting(
            name=f"{prefix}_host",
            section=section,
            attr=f"{attr}host",
            kind="text",
            help=(
                f"address {what} listens on: 127.0.0.1 serves this host only; 0.0.0.0 (or ::) "
                "every interface, an interface's address that one (then set "
                f"{prefix}_tls_cert, and {prefix}_tls_client_ca to admit only your Prometheus)"
            ),
            default=LOOPBACK,
        ),
        Setting(
            name=f"{prefix}_tls_cert",
            section=section,
            attr=f"{attr}tls_cert",
            kind="path",
            help=(
                f"certificate file (PEM) {what} serves https with, with {prefix}_tls_key; "
                "unset: plain http"
            ),
        ),
        Setting(
            name=f"{prefix}_tls_key",
            section=section,
            attr=f"{attr}tls_key",
            kind="path",
            help=f"private key file (PEM) of {prefix}_tls_cert",
        ),
        Setting(
            name=f"{prefix}_tls_client_ca",
            section=section,
            attr=f"{attr}tls_client_ca",
            kind="path",
            help=(
                "CA certificate file a scraper's client certificate must be signed by: mutual "
                f"TLS, a scrape without such a certificate is refused (with {prefix}_tls_cert)"
            ),
        ),
    )


def _tls_settings(
    section: str, server: str, ca_note: str, prefix: str = "", alias: str = ""
) -> tuple[Setting, ...]:
    """The CA, client certificate and key files of one server's TLS: the same three
    settings for both servers, so they are written once. ``prefix`` starts their names
    (default: the section's), ``alias`` their former names'."""
    prefix = prefix or section

    def aliases(suffix: str) -> tuple[str, ...]:
        return (f"{alias}_{suffix}",) if alias else ()

    return (
        Setting(
            name=f"{prefix}_tls_ca",
            section=section,
            attr="tls_ca",
            kind="path",
            help=f"CA certificate file the certificate of {server} must be signed by ({ca_note})",
            aliases=aliases("tls_ca"),
        ),
        Setting(
            name=f"{prefix}_tls_cert",
            section=section,
            attr="tls_cert",
            kind="path",
            help=f"client certificate file for {server} (with {prefix}_tls_key)",
            aliases=aliases("tls_cert"),
        ),
        Setting(
            name=f"{prefix}_tls_key",
            section=section,
            attr="tls_key",
            kind="path",
            help=f"private key file of the client certificate for {server}",
            aliases=aliases("tls_key"),
        ),
    )


SETTINGS: tuple[Setting, ...] = (
    # The staging store (lanes too: a line's lane is chosen when it is staged).
    Setting(
        name="staging_url",
        section=STAGING,
        attr="url",
        kind="staging_url",
        help="SQLAlchemy URL of the staging database (postgresql+psycopg://user@host:5432/db)",
        required=True,
        flag=True,
    ),
    Setting(
        name="retention",
        section=STAGING,
        attr="retention_s",
        kind="duration",
        help="how long staged points of ended epochs are kept for resending and verifying",
        default=7 * 86400,
    ),
    Setting(
        name="orphan_grace",
        section=STAGING,
        attr="orphan_grace_s",
        kind="duration",
        help="age after which a write of a never-decided epoch is garbage",
        default=3600,
    ),
    Setting(
        name="gc_interval",
        section=STAGING,
        attr="gc_interval_s",
        kind="duration",
        help=(
            "how often the process committing a sink collects its garbage (staged points past "
            "retention, orphaned writes) on a thread of its own, a bounded amount each time; "
            "0: never (then run `twophase gc`)"
        ),
        default=600,
    ),
    Setting(
        name="history_retention",
        section=STAGING,
        attr="history_retention_s",
        kind="duration",
        help=(
            "how long an ended epoch's record (its row, writes, history, deliveries) is kept; "
            "past it, once its points are purged (retention) and every target holds it, GC "
            "compacts it into the sink's floor (every epoch up to N was delivered), which "
            "still tells a replay of it"
        ),
        default=30 * 86400,
    ),
    Setting(
        name="staging_connect_timeout",
        section=STAGING,
        attr="connect_timeout_s",
        kind="duration",
        help="timeout of a connection to the staging database",
        default=10,
    ),
    Setting(
        name="staging_retry_deadline",
        section=STAGING,
        attr="retry_deadline_s",
        kind="duration",
        help=(
            "how long a step (claim, decide, mark, a task's staging) retries while the staging "
            "database is unreachable before failing (retryable), counted from its first failure "
            "since its last progress"
        ),
        default=60.0,
    ),
    Setting(
        name="staging_lock_timeout",
        section=STAGING,
        attr="lock_timeout_s",
        kind="duration",
        help=(
            "longest one statement waits for a row lock another session holds (PostgreSQL's "
            "lock_timeout); the step then fails retryably and is tried again, until "
            "staging_retry_deadline. 0: wait without limit"
        ),
        default=10.0,
    ),
    Setting(
        name="staging_session_timeout",
        section=STAGING,
        attr="session_timeout_s",
        kind="duration",
        help=(
            "how long PostgreSQL keeps a session that holds a transaction open without a "
            "statement (idle_in_transaction_session_timeout), or whose peer stopped answering "
            "(TCP keepalives and tcp_user_timeout, on both ends), before it ends the session "
            "and releases its locks: the longest a frozen or lost driver holds up the next "
            "run. 0: never"
        ),
        default=30.0,
    ),
    Setting(
        name="staging_chunk_points",
        section=STAGING,
        attr="chunk_points",
        kind="int",
        help="lines per staged chunk (a promote request holds whole chunks)",
        default=_REQUEST_POINTS,
        minimum=1,
    ),
    Setting(
        name="staging_chunk_chars",
        section=STAGING,
        attr="chunk_chars",
        kind="int",
        help="characters per staged chunk (a longer line is a chunk alone)",
        default=1024 * 1024,
        minimum=1,
        maximum=MAX_CHUNK_CHARS,
    ),
    Setting(
        name="staging_spool_memory",
        section=STAGING,
        attr="spool_memory",
        kind="int",
        help=(
            "bytes of a task's staged chunks and rejected rows kept in memory, so that its "
            "staging can be repeated after a lost connection; beyond them, a temporary file "
            "(in Spark's local directory on executors)"
        ),
        default=64 * 1024 * 1024,
        minimum=0,
    ),
    Setting(
        name="driver_staging_bytes",
        section=STAGING,
        attr="driver_staging_bytes",
        kind="int",
        help=(
            "a foreachBatch micro-batch that Spark's plan estimates at no more than this "
            "many bytes is collected once and staged from the driver, instead of by a Spark "
            "task per partition; 0 stages every micro-batch in tasks"
        ),
        # Below where the driver's one Python thread stops beating the tasks on two cores
        # (docs/performance.md): a cluster's tasks spread over more cores, the driver not.
        default=4 << 20,
        minimum=0,
    ),
    Setting(
        name="compression",
        section=STAGING,
        attr="compression",
        kind="choice",
        help=(
            "gzip: each staged chunk is compressed on the executor and stored as it is, and "
            "sent to an InfluxDB target as it is (Content-Encoding: gzip); none: chunks are "
            "stored and sent as text"
        ),
        default=GZIP,
        choices=COMPRESSIONS,
    ),
    *_tls_settings(
        STAGING,
        "the staging database",
        "libpq's sslrootcert; sslmode defaults to verify-full then. Without it, a host "
        "that is not loopback gets verify-full against the system's CAs unless the URL "
        "chooses its sslmode",
    ),
    Setting(
        name="promote_connections",
        section=STAGING,
        attr="lanes",
        kind="int",
        help=(
            "connections an epoch is promoted over at once (its lanes); each series keeps to "
            "one lane, chosen when its points are staged"
        ),
        default=4,
        minimum=1,
        maximum=MAX_LANES,
    ),
    # The targets, and how an epoch is promoted to them. Most settings of every kind
    # of target are named target_*; the influx_* ones are the InfluxDB kind's own, and
    # the section says which kind reads a setting.
    Setting(
        name="target_url",
        section=TARGET,
        attr="url",
        kind="http_url",
        help="the target's URL: http(s)://host:port of an InfluxDB server, or"
        " postgresql://user@host:port/dbname of PostgreSQL (or targets, for several)",
        flag=True,
        aliases=("influx_url",),
    ),
    Setting(
        name="targets",
        section=TARGET,
        attr="targets",
        kind="targets",
        help=(
            "instead of target_url, the targets a sink delivers each epoch to, "
            "comma-separated name=URL (a=http://h1:8086,pg=postgresql://u@h2:5432/db), the "
            "kind of each told by its URL's scheme; "
            "names [a-z][a-z0-9_-]*; one server's own settings: "
            "TWOPHASE_TARGET_<NAME>_<SETTING>"
        ),
        flag=True,
    ),
    Setting(
        name="min_targets",
        section=TARGET,
        attr="min_targets",
        kind="int",
        help=(
            "targets that must have an epoch before it counts as delivered (COMMITTED); "
            "at most the number of targets"
        ),
        default=1,
        minimum=1,
    ),
    Setting(
        name="target_deadline",
        section=TARGET,
        attr="target_deadline_s",
        kind="duration",
        help=(
            "how long a commit keeps retrying a failing target, once min_targets targets "
            "have the epoch, before it leaves that target lagging"
        ),
        default=5.0,
    ),
    Setting(
        name="target_max_lag",
        section=TARGET,
        attr="target_max_lag_s",
        kind="duration",
        help="how long a target may lag behind before it is quarantined",
        default=24 * 3600.0,
    ),
    Setting(
        name="target_max_backlog_bytes",
        section=TARGET,
        attr="target_max_backlog_bytes",
        kind="int",
        help=(
            "staged bytes (as stored) of the COMMITTED epochs a target lacks past which it "
            "is quarantined, as for target_max_lag; epochs committed before its last resync "
            "do not count. 0: no bound"
        ),
        default=0,
        minimum=0,
    ),
    Setting(
        name="target_catch_up_rate",
        section=TARGET,
        attr="target_catch_up_rate",
        kind="int",
        help=(
            "points per second a lagging target's backlog is delivered at (catch-up, "
            "recover, resync), each request waiting its turn; a commit's own epoch is never "
            "held back. 0: as fast as the target takes them"
        ),
        default=0,
        minimum=0,
    ),
    Setting(
        name="target_kind",
        section=TARGET,
        attr="kind",
        kind="text",
        help="the kind of target: auto (told by the URL's scheme: http(s) InfluxDB,"
        " postgresql PostgreSQL/TimescaleDB), or a kind's name (influxdb, postgresql, or one"
        " a package adds through the twophase.targets entry points)",
        default="auto",
    ),
    Setting(
        name="target_schema",
        section=POSTGRESQL,
        attr="schema",
        kind="text",
        help="PostgreSQL targets: the schema of the tables points go to (one table per"
        " measurement) and of the table recording delivered epochs",
        default="public",
    ),
    Setting(
        name="target_create_tables",
        section=POSTGRESQL,
        attr="create_tables",
        kind="bool",
        help="PostgreSQL targets: create a measurement's table (and add a field's column)"
        " when missing; false: check the tables against what the sink writes",
        default=False,
    ),
    Setting(
        name="target_lock_timeout",
        section=POSTGRESQL,
        attr="lock_timeout_s",
        kind="duration",
        help=(
            "PostgreSQL targets: longest one statement waits for a lock a reader or another "
            "session holds, on a table or a row (PostgreSQL's lock_timeout); the epoch then "
            "starts over, until target_retry_deadline, past which the target lags while the "
            "others go on. A table's DDL waits in short tries within it. 0: wait without limit"
        ),
        default=5.0,
        maximum=PG_MAX_TIMEOUT_S,
    ),
    Setting(
        name="target_statement_timeout",
        section=POSTGRESQL,
        attr="statement_timeout_s",
        kind="duration",
        help=(
            "PostgreSQL targets: longest one statement may run (PostgreSQL's "
            "statement_timeout, lock waits included); the epoch then starts over, as for "
            "target_lock_timeout. 0: no limit"
        ),
        default=60.0,
        maximum=PG_MAX_TIMEOUT_S,
    ),
    Setting(
        name="influx_api",
        section=INFLUXDB,
        attr="api",
        kind="choice",
        help="v1 (/write), v2 (/api/v2/write), v3 (InfluxDB 3's /api/v3/write_lp) or auto"
        " (asks /ping; never picks v3)",
        default="auto",
        choices=INFLUX_APIS,
        flag=True,
    ),
    Setting(
        name="influx_db",
        section=INFLUXDB,
        attr="database",
        kind="text",
        help="1.x or 3.x database",
        flag=True,
    ),
    Setting(
        name="influx_rp",
        section=INFLUXDB,
        attr="retention_policy",
        kind="text",
        help="1.x retention policy",
        flag=True,
    ),
    Setting(
        name="target_username",
        section=TARGET,
        attr="username",
        kind="text",
        help="user of the target (InfluxDB 1.x, PostgreSQL)",
        aliases=("influx_user",),
    ),
    Setting(
        name="target_password",
        section=TARGET,
        attr="password",
        kind="secret",
        help="password of target_username (InfluxDB 1.x, PostgreSQL)",
        aliases=("influx_password",),
    ),
    Setting(
        name="influx_org",
        section=INFLUXDB,
        attr="org",
        kind="text",
        help="2.x organisation",
        flag=True,
    ),
    Setting(
        name="influx_bucket",
        section=INFLUXDB,
        attr="bucket",
        kind="text",
        help="2.x bucket",
        flag=True,
    ),
    Setting(
        name="influx_token", section=INFLUXDB, attr="token", kind="secret", help="2.x or 3.x token"
    ),
    *_tls_settings(TARGET, "an https target", "default: the system's CAs", "target", "influx"),
    Setting(
        name="allow_plaintext_credentials",
        section=TARGET,
        attr="allow_plaintext_credentials",
        kind="bool",
        help=(
            "send the password or token over plain http:// to a host that is not "
            "loopback (127.0.0.0/8, ::1, localhost); without it such a target is refused "
            "when credentials are configured: use https://"
        ),
        default=False,
    ),
    Setting(
        name="target_timeout",
        section=TARGET,
        attr="timeout_s",
        kind="duration",
        help="one HTTP request's timeout",
        default=10.0,
        aliases=("influx_timeout",),
    ),
    Setting(
        name="target_batch_points",
        section=TARGET,
        attr="batch_points",
        kind="int",
        help=(
            "points per promote request; at least staging_chunk_points, or chunks are cut "
            "into text to fit, and best a multiple of it, which fills each request"
        ),
        # Two chunks: a larger request spares the driver CPU per point, until too few
        # requests are in flight to keep the lanes busy (the request-size study:
        # `git show d30d2b1^:bench/request_size.py`).
        default=2 * _REQUEST_POINTS,
        minimum=1,
        aliases=("influx_batch_points",),
    ),
    Setting(
        name="target_batch_bytes",
        section=TARGET,
        attr="batch_bytes",
        kind="int",
        help="bytes per promote request",
        default=4 * 1024 * 1024,
        minimum=1024,
        aliases=("influx_batch_bytes",),
    ),
    Setting(
        name="target_retry_deadline",
        section=TARGET,
        attr="retry_deadline_s",
        kind="duration",
        help="how long promotion retries without progress before failing (retryable)",
        default=300.0,
        aliases=("influx_retry_deadline",),
    ),
    Setting(
        name="target_retry_initial",
        section=TARGET,
        attr="retry_initial_s",
        kind="duration",
        help="first backoff step",
        default=0.5,
        aliases=("influx_retry_initial",),
    ),
    Setting(
        name="target_retry_max",
        section=TARGET,
        attr="retry_max_s",
        kind="duration",
        help="largest backoff step",
        default=30.0,
        aliases=("influx_retry_max",),
    ),
    Setting(
        name="promotion",
        section=TARGET,
        attr="promotion",
        kind="choice",
        help=(
            "inline: a commit returns once its epoch is in the targets; background: once it is "
            "decided, while a thread promotes it and the next batch computes (the next commit "
            "waits for it)"
        ),
        default=INLINE,
        choices=PROMOTIONS,
        # Sent points before the decision: a point stamped by the clock, recomputed on a
        # retry or a replay, stayed in the target beside the one chosen.
        removed=("overlap",),
    ),
    Setting(
        name="metrics_port",
        section=TARGET,
        attr="metrics_port",
        kind="int",
        help=(
            "port of the Prometheus endpoint of the process that promotes (the Spark driver): "
            "its requests to the targets; off when unset"
        ),
        minimum=1,
    ),
    *_endpoint_settings("metrics", TARGET, "metrics_", "the driver's endpoint (metrics_port)"),
    # The exporter of the store's metrics (`twophase metrics serve`).
    Setting(
        name="exporter_port",
        section=EXPORTER,
        attr="port",
        kind="int",
        help="port of the exporter (`twophase metrics serve`); 0: any free port",
        default=9464,
        minimum=0,
        maximum=65535,
    ),
    *_endpoint_settings("exporter", EXPORTER, "", "the exporter"),
    Setting(
        name="exporter_cache",
        section=EXPORTER,
        attr="cache_s",
        kind="duration",
        help=(
            "how long the exporter answers scrapes with its last read of the staging store: "
            "scrapes within it (several Prometheus servers, a retried scrape) cost no query; "
            "0: every scrape reads the store"
        ),
        default=5.0,
    ),
    # How rows become points (the sink's executors read it with the point builder).
    Setting(
        name="allow_newlines_in_strings",
        section=POINTS,
        attr="allow_newlines",
        kind="bool",
        help=(
            "true: a string field value may hold a raw line feed or carriage return, which "
            "InfluxDB reads inside the quotes; false: such a row is a dead letter, since "
            "VictoriaMetrics ends a line at every newline and would read the rest of the "
            "value as points of its own. Set true only if every target is InfluxDB"
        ),
        default=False,
    ),
)

# Every setting by its option name and by each of its aliases.
BY_NAME: dict[str, Setting] = {name: s for s in SETTINGS for name in s.names}
OPTIONS = tuple(s.name for s in SETTINGS)
# Former option name -> its setting's option name (``influx_url`` -> ``target_url``).
ALIASES: dict[str, str] = {alias: s.name for s in SETTINGS for alias in s.aliases}
SECRET_OPTIONS = tuple(s.name for s in SETTINGS if s.secret)
CLI_FLAGS = tuple(s.name for s in SETTINGS if s.flag)
# The former names of CLI flags' settings: still flags (``--influx-url``).
CLI_ALIASES = tuple(alias for s in SETTINGS if s.flag for alias in s.aliases)
# The target settings of the sink as a whole, not of one target: where it delivers,
# how many targets must take an epoch, how it promotes, its metrics endpoint.
SINK_WIDE = (
    "target_url",
    "targets",
    "min_targets",
    "target_deadline",
    "target_max_lag",
    "target_max_backlog_bytes",
    "promotion",
    "metrics_port",
    "metrics_host",
    "metrics_tls_cert",
    "metrics_tls_key",
    "metrics_tls_client_ca",
)
# The settings one target may override (TWOPHASE_TARGET_<NAME>_<OPTION>, [targets.NAME]).
PER_TARGET = tuple(
    s.name for s in SETTINGS if s.section in TARGET_SECTIONS and s.name not in SINK_WIDE
)


def default(name: str) -> Any:
    """The table's default of a setting (for the config objects' fields)."""
    return BY_NAME[name].default
