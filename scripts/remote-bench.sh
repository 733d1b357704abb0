#!/usr/bin/env bash
# Remote AR, SD, SSD and the engine's own choice (auto) against `saguaro serve` through
# scripts/delay-proxy.py at several round trips, on this machine's loopback. Usage:
#   scripts/remote-bench.sh TARGET.gguf DRAFT.gguf "0 20 50" [extra bench args...]
set -euo pipefail
target=$1 draft=$2 rtts=$3
shift 3
bin=${SAGUARO:-target/release/saguaro}
port=${PORT:-30100}
"$bin" serve --target "$target" --threads 1 --listen "127.0.0.1:$port" >/dev/null 2>&1 &
server=$!
proxy=
cleanup() {
  kill "$server" 2>/dev/null || true
  [ -n "$proxy" ] && kill "$proxy" 2>/dev/null || true
}
trap cleanup EXIT
for _ in $(seq 120); do curl -sf "http://127.0.0.1:$port/health" >/dev/null && break; sleep 1; done
for rtt in $rtts; do
  python3 scripts/delay-proxy.py --listen "127.0.0.1:$((port + 1))" --upstream "127.0.0.1:$port" --rtt-ms "$rtt" >/dev/null &
  proxy=$!
  sleep 1
  echo "== round trip $rtt ms"
  "$bin" bench --target "http://127.0.0.1:$((port + 1))" --draft "$draft" --draft-threads 1 --modes ar,sd,ssd,auto "$@"
  kill "$proxy"
  wait "$proxy" 2>/dev/null || true
  proxy=
done
