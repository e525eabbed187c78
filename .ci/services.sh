#!/usr/bin/env bash
# Start the local services the tests use when they are not already answering.
set -euo pipefail

redis_up() { timeout 2 bash -c 'exec 3<>/dev/tcp/127.0.0.1/6379 && printf "PING\r\n" >&3 && head -c5 <&3' 2>/dev/null | grep -q PONG; }

if ! redis_up; then
  if ! command -v redis-server >/dev/null; then
    echo "services: installing redis-server (Debian)"; apt-get install -y -qq redis-server >/dev/null
  fi
  mkdir -p /var/lib/redis /var/log/redis
  redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no \
    --dir /var/lib/redis --logfile /var/log/redis/ci.log
  for _ in $(seq 50); do redis_up && break; sleep 0.1; done
fi
redis_up && echo "services: redis ok at 127.0.0.1:6379"

# redis-server + redis-cli on PATH for the Redis Cluster the tests start themselves
# (workers/dev/redis_cluster.py): needed even where a Redis already answers on 6379.
command -v redis-server >/dev/null && command -v redis-cli >/dev/null || {
  echo "services: installing redis-server + redis-tools (Debian) for the test Redis Cluster"
  apt-get install -y -qq redis-server redis-tools >/dev/null || {
    apt-get update -qq && apt-get install -y -qq redis-server redis-tools >/dev/null
  }
}

# Prometheus + promtool + Alertmanager (Debian) for the rule tests and the real-Prometheus test.
command -v promtool >/dev/null && command -v prometheus-alertmanager >/dev/null || {
  echo "services: installing prometheus + alertmanager (Debian)"
  apt-get install -y -qq --no-install-recommends prometheus prometheus-alertmanager >/dev/null || {
    apt-get update -qq && apt-get install -y -qq --no-install-recommends prometheus prometheus-alertmanager >/dev/null
  }
}
promtool --version 2>&1 | head -1

# libfaketime (Debian) for the fault test of a worker whose clock is off (tests/test_chaos.py).
[ -e /usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1 ] || ls /usr/lib/*/faketime/libfaketime.so.1 >/dev/null 2>&1 || {
  echo "services: installing faketime (Debian)"
  apt-get install -y -qq --no-install-recommends faketime >/dev/null || {
    apt-get update -qq && apt-get install -y -qq --no-install-recommends faketime >/dev/null
  }
}

# Chromium + chromedriver (Debian) for the report's real-browser test (tests/test_report.py).
command -v chromium >/dev/null && command -v chromedriver >/dev/null || {
  echo "services: installing chromium + chromedriver (Debian)"
  apt-get install -y -qq --no-install-recommends chromium chromium-driver >/dev/null || {
    apt-get update -qq && apt-get install -y -qq --no-install-recommends chromium chromium-driver >/dev/null
  }
}
chromium --version 2>/dev/null | head -1

# Helm (from the Go module proxy) for the chart's lint/template tests (tests/test_helm.py).
command -v helm >/dev/null || [ -x "$(go env GOPATH 2>/dev/null)/bin/helm" ] || {
  command -v go >/dev/null || { echo "services: go is missing (needed to install helm)"; exit 1; }
  echo "services: installing helm v3.22.0 (go install, ~1-2 min)"
  bindir=/usr/local/bin; [ -w "$bindir" ] || bindir="$(go env GOPATH)/bin"
  GOBIN="$bindir" GOFLAGS=-mod=mod go install helm.sh/helm/v3/cmd/helm@v3.22.0
}
helm_bin=$(command -v helm || echo "$(go env GOPATH)/bin/helm")
echo "services: helm $("$helm_bin" version --short)"
