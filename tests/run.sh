#!/usr/bin/env bash
# Runs the whole test suite on a fresh machine, installing what is missing:
# the servers the tests start (Debian packages, when root), a virtualenv in
# .venv with the package, all its extras and requirements/dev.txt, then ruff,
# mypy and pytest.
# Extra arguments go to pytest (e.g. --run-slow for the torture tests, or
# -n 0 for one process). The tests mostly wait on servers and timers, so
# they run in parallel workers (pytest-xdist), more than there are cores;
# each worker starts the servers it needs on ports of its own, and runs
# whole modules (--dist loadfile; tests/conftest.py names the exceptions).
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
# Sentinel failovers and the Cluster tests start redis-sentinel and create the cluster with redis-cli
command -v redis-sentinel >/dev/null 2>&1 || missing+=(redis-sentinel)
command -v redis-cli >/dev/null 2>&1 || missing+=(redis-tools)
# PostgreSQL: Debian keeps initdb/postgres in /usr/lib/postgresql/<version>/bin
if ! { command -v initdb && command -v postgres; } >/dev/null 2>&1 \
    && ! compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null; then
    missing+=(postgresql)
fi
# ZooKeeper runs from Debian's jars with java; the Curator interop test compiles with javac
[ -e /usr/share/java/zookeeper.jar ] || missing+=(zookeeper)
command -v java >/dev/null 2>&1 || missing+=(default-jre-headless)
[ -e /usr/share/java/curator-recipes.jar ] || missing+=(libcurator-recipes-java)
command -v javac >/dev/null 2>&1 || missing+=(default-jdk-headless)
# etcd (one member, or three on loopback) and etcdctl for the lock interop tests
command -v etcd >/dev/null 2>&1 || missing+=(etcd-server)
command -v etcdctl >/dev/null 2>&1 || missing+=(etcd-client)
# MariaDB: mariadb-install-db and mariadbd (with its plugins), and the mariadb client for the interop tests
{ command -v mariadb-install-db && { command -v mariadbd || [ -x /usr/sbin/mariadbd ]; }; } >/dev/null 2>&1 \
    || missing+=(mariadb-server)
command -v mariadb >/dev/null 2>&1 || missing+=(mariadb-client)
# The SPIN models (tests/test_models.py): spin writes each model out as C, gcc compiles it
command -v spin >/dev/null 2>&1 || missing+=(spin)
command -v gcc >/dev/null 2>&1 || missing+=(gcc)
if ((${#missing[@]})); then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "installing: ${missing[*]}"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    else
        echo "missing: ${missing[*]} (install them, or run this as root on Debian/Ubuntu)" >&2
        exit 1
    fi
fi

if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[all,examples]' -r requirements/dev.txt

.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
exec .venv/bin/python -m pytest -n 4 --dist loadfile "$@"
