#!/usr/bin/env bash
# Runs the benchmarks: installs the servers (Debian packages, when root) and
# requirements/benchmarks.txt into .venv if they are missing, then
# `python -m benchmarks` with the given arguments (e.g. --quick).
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
if ! { command -v initdb && command -v postgres; } >/dev/null 2>&1 \
    && ! compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null; then
    missing+=(postgresql)
fi
compgen -G "/usr/share/java/zookeeper*.jar" >/dev/null || missing+=(zookeeper)
command -v java >/dev/null 2>&1 || missing+=(default-jre-headless)
command -v etcd >/dev/null 2>&1 || missing+=(etcd-server)
{ command -v mariadb-install-db && { command -v mariadbd || [ -x /usr/sbin/mariadbd ]; }; } >/dev/null 2>&1 \
    || missing+=(mariadb-server)
command -v mariadb >/dev/null 2>&1 || missing+=(mariadb-client)
if ((${#missing[@]})); then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "installing: ${missing[*]}"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    else
        echo "missing: ${missing[*]} (their backends will be skipped)" >&2
    fi
fi

if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
if ! .venv/bin/python -c 'import asynclock, redis_lock, pottery, aiozk, kazoo, asyncpg, asyncmy, grpc, matplotlib' 2>/dev/null; then
    .venv/bin/python -m pip install -q --disable-pip-version-check -e '.[redis,zookeeper,postgres,mysql,etcd]' \
        -r requirements/benchmarks.txt
fi
exec .venv/bin/python -m benchmarks "$@"
