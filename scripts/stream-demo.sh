#!/usr/bin/env bash
# The streaming loop on real Kafka and Redis: start the services, a worker (ltrf) and the cluster
# emulator replaying a SWIM Facebook 2009 sample; then print the emulator's report and the
# per-tenant accumulated usage the worker keeps in Redis. Installs what it needs.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/bootstrap.sh"
bash "$root/scripts/services.sh" start
fs="$root/.venv/bin/fairstream"
app="demo$(date +%s)"
log="$(mktemp)"
"$fs" worker --policy ltrf --app-id "$app" --topic-prefix "$app" --max-lateness 1e9 --metrics-port 0 >"$log" 2>&1 &
worker=$!
trap 'kill $worker 2>/dev/null || true' EXIT
trace="$root/tests/data/FB-2009_samples_24_times_1hr_1.head60.tsv"
echo "emulating 40 jobs of $(basename "$trace") on 3 nodes through Kafka (worker log: $log)" >&2
"$fs" emulate "$trace" --format swim --limit 40 --nodes 3 --cluster demo --speed 50 --topic-prefix "$app" --timeout 300
echo "accumulated usage per tenant in Redis (key $app:c:demo:view:usage:0):" >&2
redis-cli -p "${FAIRSTREAM_REDIS_PORT:-6379}" hgetall "$app:c:demo:view:usage:0"
