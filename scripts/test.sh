#!/usr/bin/env bash
# The test suite on a fresh machine: install, start Kafka and Redis and a Kubernetes control
# plane, run pytest.
# Extra arguments go to pytest. `scripts/services.sh stop` stops the services afterwards.
# pytest's exit code 5 ("no tests collected") is a failure here, not a pass.
# `scripts/test.sh --fast`: the fast part alone (no live services, no long properties or whole
# workloads: `-m "not live and not slow"`), without starting Kafka, Redis or Kubernetes.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
selected=()
if [ "${1:-}" = "--fast" ]; then
  selected=(-m "not live and not slow")
  shift
fi
bash "$root/scripts/bootstrap.sh" || exit 1
if [ "${#selected[@]}" -eq 0 ]; then
  # Real Kafka (KRaft) and Redis for the worker's tests: installed and started if not running.
  bash "$root/scripts/services.sh" start || exit 1
  # A real Kubernetes control plane for the connector's tests (etcd, kube-apiserver, kwok): built
  # with `go` into a cache outside the checkout the first time (about 7.5 minutes), then started.
  bash "$root/scripts/kube.sh" start || exit 1
fi
cd "$root"
"$root/.venv/bin/python" -m pytest "${selected[@]}" "$@"
status=$?
if [ "$status" -eq 5 ]; then
  echo "test.sh: pytest collected no tests: failing" >&2
  exit 1
fi
exit "$status"
