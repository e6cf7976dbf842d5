#!/usr/bin/env bash
# The test suite on a fresh machine: install, then run pytest. Extra arguments go to pytest.
# pytest's exit code 5 ("no tests collected") is a failure here, not a pass.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/bootstrap.sh" || exit 1
cd "$root"
"$root/.venv/bin/python" -m pytest "$@"
status=$?
if [ "$status" -eq 5 ]; then
  echo "test.sh: pytest collected no tests: failing" >&2
  exit 1
fi
exit "$status"
