#!/usr/bin/env bash
# Build the package and serve the demo: www/, pkg/ and models/ on 127.0.0.1.
# Usage: scripts/serve-demo.sh [--port N] [--no-build]
set -euo pipefail
cd "$(dirname "$0")/.."
port=8080
build=1
while [ $# -gt 0 ]; do
  case "$1" in
    --port) port="$2"; shift 2 ;;
    --no-build) build=0; shift ;;
    -h|--help) sed -n '2,3p' "$0"; exit 0 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
[ "$build" -eq 0 ] || scripts/build-web.sh
[ -d models ] || echo "note: models/ is missing; run scripts/fetch-models.sh to serve the default models" >&2
exec node scripts/serve.mjs . "$port"
