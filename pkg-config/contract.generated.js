// Generated from the Rust types (src/contract) by `scripts/gen-contract.sh`: do not edit.

export const DEFAULTS = Object.freeze({
  "context": 4096,
  "maxTokens": 256,
  "threadCap": 8,
  "modes": [
    "ar",
    "sd",
    "ssd"
  ],
  "batchModes": [
    "ar",
    "sd"
  ],
  "parallel": 1,
  "specK": 4,
  "fanout": "uniform:3",
  "backup": "jit",
  "temperature": 0.0,
  "topK": 0,
  "topP": 1.0,
  "seed": 0,
  "serverTopN": 64,
  "serverTimeoutMs": 60000.0,
  "serverRetries": 3,
  "serverBackoffMs": 100.0
});

export const LIMITS = Object.freeze({
  "maxThreads": 64,
  "maxModelBytes": 3758096384.0,
  "maxParallel": 16
});
