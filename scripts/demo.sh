#!/usr/bin/env bash
# The main job on a fresh machine: install, then run the four-queue macro-benchmark under
# static, fair and ltrf (no Kafka, no Redis). Extra arguments go to `fairstream demo`.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/bootstrap.sh"
exec "$root/.venv/bin/fairstream" demo "$@"
