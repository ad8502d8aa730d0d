#!/usr/bin/env bash
# Developer and CI entry point. Idempotent: every subcommand may be run repeatedly.
#
#   scripts/dev.sh setup            install missing tools, create .venv, start the servers
#   scripts/dev.sh test [args...]   setup + ruff + mypy + pytest (args go to pytest)
#   scripts/dev.sh test --full      the same with the exhaustive test matrices (README)
#   scripts/dev.sh demo [args...]   setup + the exactly-once demo (jobs/demo.py)
#   scripts/dev.sh unit [args...]   pytest -m unit, venv only, no servers
#   scripts/dev.sh lint             ruff + mypy, venv only
#   scripts/dev.sh docs [args...]   serve the documentation site (mkdocs serve), venv only
#   scripts/dev.sh start|stop|status
#   scripts/dev.sh env              export lines: eval "$(scripts/dev.sh env)"
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$REPO/.venv"
PY="$VENV/bin/python"
SERVICES="$REPO/scripts/services.py"
APT_UPDATED=0
cd "$REPO"

say() { printf '==> %s\n' "$*" >&2; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }

as_root() {
    if [ "$(id -u)" -eq 0 ]; then
        "$@"
    elif command -v sudo >/dev/null 2>&1; then
        sudo "$@"
    else
        die "need root (or sudo) to run: $*"
    fi
}

apt_install() {
    # `apt-get update` at most once per invocation, and only when something is missing.
    if [ "$APT_UPDATED" -eq 0 ]; then
        say "apt-get update"
        as_root apt-get update -q
        APT_UPDATED=1
    fi
    say "apt-get install $*"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$@"
}

have_postgres() {
    command -v pg_ctl >/dev/null 2>&1 || compgen -G '/usr/lib/postgresql/*/bin/pg_ctl' >/dev/null
}

have_prometheus() {
    command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1
}

quiet_packaged_prometheus() {
    # Debian's postinst starts a system-wide Prometheus on 0.0.0.0:9090 where an init system
    # lets it (not in containers: no systemd, policy-rc.d). Tests start their own on free
    # ports; the packaged one would only hold 9090, so stop it and keep it from booting.
    if [ -d /run/systemd/system ]; then
        as_root systemctl disable --now prometheus.service >/dev/null 2>&1 || true
    elif [ -x /etc/init.d/prometheus ]; then
        as_root invoke-rc.d prometheus stop >/dev/null 2>&1 || true
        as_root update-rc.d prometheus disable >/dev/null 2>&1 || true
    fi
}

ensure_servers_installed() {
    local missing=() prometheus_missing=0
    have_postgres || missing+=(postgresql)
    command -v influxd >/dev/null 2>&1 || missing+=(influxdb)
    command -v victoria-metrics >/dev/null 2>&1 || missing+=(victoria-metrics)
    # Only for tests (tests/integration/test_prometheus.py): not started by `services start`.
    have_prometheus || { missing+=(prometheus); prometheus_missing=1; }
    if [ "${#missing[@]}" -gt 0 ]; then
        apt_install "${missing[@]}"
    fi
    if [ "$prometheus_missing" -eq 1 ]; then
        quiet_packaged_prometheus
    fi
}

java_major() {
    # `java -version` prints e.g. openjdk version "17.0.15" (or "1.8.0_392" for Java 8).
    local version
    version="$(java -version 2>&1 | awk -F'"' '/version/ {print $2; exit}')"
    version="${version#1.}"
    echo "${version%%.*}"
}

ensure_java() {
    # PySpark 4 needs Java 17+.
    if command -v java >/dev/null 2>&1 && [ "$(java_major)" -ge 17 ] 2>/dev/null; then
        return
    fi
    # Slim Debian images lack this folder and the JRE's postinst fails without it.
    as_root mkdir -p /usr/share/man/man1
    apt_install openjdk-17-jre-headless
}

ensure_python() {
    if ! command -v python3 >/dev/null 2>&1; then
        apt_install python3 python3-venv
    fi
    python3 -c 'import sys; sys.exit(sys.version_info < (3, 10))' \
        || die "python3 >= 3.10 required, found $(python3 --version)"
    # Debian splits venv/ensurepip into python3-venv.
    if [ ! -x "$PY" ] && ! python3 -c 'import ensurepip' >/dev/null 2>&1; then
        apt_install python3-venv
    fi
}

ensure_venv() {
    ensure_python
    if [ ! -x "$PY" ]; then
        say "creating $VENV"
        python3 -m venv "$VENV"
    fi
    # Re-install only when pyproject.toml or the tools' list changed (the stamp name carries
    # their hash).
    local stamp
    stamp="$VENV/.installed-$(cat pyproject.toml requirements/dev.txt | sha256sum | cut -c1-16)"
    if [ ! -e "$stamp" ]; then
        say "pip install -r requirements/dev.txt"
        "$PY" -m pip install -q -r requirements/dev.txt
        rm -f "$VENV"/.installed-*
        touch "$stamp"
    fi
}

services() {
    # services.py (devkit) is stdlib-only; the venv python is not required for it.
    python3 "$SERVICES" "$@"
}

cmd_setup() {
    ensure_servers_installed
    ensure_java
    ensure_venv
    say "starting servers"
    services start
}

run_step() {
    # Runs every check even after a failure, so one CI run reports all problems.
    local name="$1"
    shift
    say "$name"
    local rc=0
    "$@" || rc=$?
    if [ "$rc" -ne 0 ]; then
        say "$name FAILED (exit $rc)"
        FAILED+=("$name")
        [ "$FIRST_RC" -ne 0 ] || FIRST_RC=$rc
    fi
}

lint_steps() {
    local paths=() path
    for path in twophase migrations tests scripts jobs bench devkit examples; do
        [ -e "$path" ] && paths+=("$path")
    done
    run_step "ruff" "$VENV/bin/ruff" check "${paths[@]}"
    run_step "mypy" "$VENV/bin/mypy"
}

docs_build() {
    # The documentation site with --strict: a broken link, a page missing from the navigation
    # or a reference to an unknown object fails the test command.
    run_step "mkdocs build --strict" env NO_MKDOCS_2_WARNING=1 \
        "$VENV/bin/mkdocs" build --strict --quiet --site-dir "$REPO/.local/site"
}

finish() {
    if [ "${#FAILED[@]}" -gt 0 ]; then
        say "failed: ${FAILED[*]}"
        exit "$FIRST_RC"
    fi
    say "all checks passed"
}

cmd_test() {
    cmd_setup
    eval "$(services env)"
    export PYSPARK_PYTHON="$PY"
    export PATH="$VENV/bin:$PATH"
    FAILED=()
    FIRST_RC=0
    lint_steps
    docs_build
    # Two workers: the Spark tests on one, one after the other (tests/conftest.py groups
    # them), the rest on both; `-n 0` among the arguments runs everything in one process.
    run_step "pytest" "$VENV/bin/pytest" -n 2 --dist loadgroup "$@"
    finish
}

cmd_demo() {
    cmd_setup
    eval "$(services env)"
    export PYSPARK_PYTHON="$PY"
    say "staging schema: alembic upgrade head"
    (cd "$REPO" && "$VENV/bin/alembic" upgrade head)
    exec "$PY" "$REPO/jobs/demo.py" "$@"
}

cmd_lint() {
    ensure_venv
    FAILED=()
    FIRST_RC=0
    lint_steps
    finish
}

cmd_docs() {
    ensure_venv
    export NO_MKDOCS_2_WARNING=1
    exec "$VENV/bin/mkdocs" serve --dev-addr 127.0.0.1:8000 "$@"
}

cmd_unit() {
    ensure_venv
    exec "$VENV/bin/pytest" -m unit "$@"
}

usage() {
    sed -n '2,12p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
    exit 2
}

main() {
    [ $# -ge 1 ] || usage
    local cmd="$1"
    shift
    case "$cmd" in
        setup) cmd_setup ;;
        test) cmd_test "$@" ;;
        demo) cmd_demo "$@" ;;
        unit) cmd_unit "$@" ;;
        lint) cmd_lint ;;
        docs) cmd_docs "$@" ;;
        start) services start ;;
        stop) services stop ;;
        status) services status ;;
        env) services env ;;
        *) usage ;;
    esac
}

main "$@"
