#!/usr/bin/env bash
# Run a command with a throwaway PostgreSQL server (Debian's `postgresql` package).
#
#   scripts/with-postgres.sh .venv/bin/pytest -q      # what `make test-pg` does
#
# The server listens on 127.0.0.1 only (a free port), keeps its data in a
# mktemp directory with durability switched off (fsync=off: tests only), and is
# stopped and deleted when the command ends, however it ends. The command sees
# CHATFLOW_TEST_DATABASE_URL=postgresql://postgres@127.0.0.1:<port>/chatflow_test,
# which the PostgreSQL tests use. Run as root (CI), the server runs as the
# `postgres` user the package creates (initdb refuses root); when the server
# binaries are missing and we are root, the package is installed first.
set -euo pipefail

if [ "$#" -eq 0 ]; then
    echo "usage: $0 COMMAND [ARG...]" >&2
    exit 64
fi

find_initdb() {
    ls -d /usr/lib/postgresql/*/bin/initdb 2>/dev/null | sort -V | tail -n 1
}

initdb_path=$(find_initdb || true)
if [ -z "$initdb_path" ]; then
    if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "with-postgres: installing Debian's postgresql package" >&2
        apt-get update -qq >/dev/null
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
        initdb_path=$(find_initdb || true)
    fi
    if [ -z "$initdb_path" ]; then
        echo "with-postgres: PostgreSQL server binaries not found under /usr/lib/postgresql;" \
            "install them (apt-get install postgresql)" >&2
        exit 1
    fi
fi
bindir=$(dirname "$initdb_path")

# The knowledge base's vectors (EMBEDDING_MODEL) need pgvector: installed when Debian
# packages it for this server version (bookworm does not for 15; its tests then run
# full-text only and say so).
major=$(basename "$(dirname "$bindir")")
if [ "$(id -u)" -eq 0 ] && command -v apt-cache >/dev/null 2>&1 \
    && [ ! -e "/usr/share/postgresql/$major/extension/vector.control" ] \
    && apt-cache show "postgresql-$major-pgvector" >/dev/null 2>&1; then
    echo "with-postgres: installing postgresql-$major-pgvector" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "postgresql-$major-pgvector" >/dev/null || true
fi

# PgBouncer (issue #38): the tests that run through a transaction-mode pooler start
# Debian's pgbouncer themselves (tests/pgbouncer.py); installed here so CI has it.
if [ "$(id -u)" -eq 0 ] && ! command -v pgbouncer >/dev/null 2>&1 \
    && [ ! -x /usr/sbin/pgbouncer ] && command -v apt-get >/dev/null 2>&1; then
    echo "with-postgres: installing Debian's pgbouncer package" >&2
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq pgbouncer >/dev/null
fi

workdir=$(mktemp -d "${TMPDIR:-/tmp}/chatflow-pg.XXXXXX")
as_server_user() {
    if [ "$(id -u)" -eq 0 ]; then
        # From /: the postgres user may not be allowed into the caller's folder (a
        # clone under a 0700 home), which PostgreSQL would report, harmlessly but alarmingly.
        (cd / && runuser -u postgres -- "$@")
    else
        "$@"
    fi
}
if [ "$(id -u)" -eq 0 ]; then
    chown postgres "$workdir"
fi

stop_server() {
    if [ -f "$workdir/data/postmaster.pid" ]; then
        as_server_user "$bindir/pg_ctl" -D "$workdir/data" -m immediate -w stop >/dev/null 2>&1 || true
    fi
    rm -rf "$workdir"
}
trap stop_server EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')

as_server_user "$bindir/initdb" -D "$workdir/data" -U postgres -A trust -E UTF8 --no-sync \
    >"$workdir/initdb.log" 2>&1 || { cat "$workdir/initdb.log" >&2; exit 1; }
as_server_user "$bindir/pg_ctl" -D "$workdir/data" -l "$workdir/server.log" -w -t 60 \
    -o "-p $port -k $workdir -c listen_addresses=127.0.0.1 -c max_connections=300 -c fsync=off -c synchronous_commit=off -c full_page_writes=off" \
    start >/dev/null || { cat "$workdir/server.log" >&2; exit 1; }
"$bindir/createdb" -h 127.0.0.1 -p "$port" -U postgres chatflow_test

export CHATFLOW_TEST_DATABASE_URL="postgresql://postgres@127.0.0.1:$port/chatflow_test"
echo "with-postgres: PostgreSQL $("$bindir/postgres" --version | awk '{print $3}') on 127.0.0.1:$port" >&2
"$@"
