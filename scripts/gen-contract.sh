#!/usr/bin/env bash
# Rewrite the npm package's generated contract, pkg-config/contract.generated.d.ts (TypeScript
# types) and pkg-config/contract.generated.js (DEFAULTS, LIMITS), from the Rust types in
# src/contract, src/error.rs and the result types they name. `cargo test --lib` fails while the
# committed files differ from what Rust says.
set -euo pipefail
cd "$(dirname "$0")/.."
SAGUARO_BLESS=1 cargo test --release --lib contract::generated
