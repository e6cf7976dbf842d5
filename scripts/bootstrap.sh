#!/usr/bin/env bash
# Create .venv (Python >= 3.11) and install fairstream with its test extras into it.
# Idempotent: a second run only re-checks the install. Sourced by demo.sh and test.sh.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/.venv"
python="${PYTHON:-python3}"
if ! "$python" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' 2>/dev/null; then
  echo "fairstream needs Python >= 3.11 (found: $("$python" --version 2>&1)); set PYTHON=/path/to/python3.11" >&2
  exit 1
fi
if [ ! -x "$venv/bin/python" ]; then
  "$python" -m venv "$venv"
fi
# (The compiled module's sources count, and whether cargo is there: a change to either, Rust
# installed after a first install without it say, builds it again.)
stamp="$venv/.installed-$({ cat "$root/pyproject.toml" "$root"/native/Cargo.* "$root"/native/src/*.rs; command -v cargo || true; } | sha256sum | cut -c1-16)"
if [ ! -f "$stamp" ]; then
  echo "fairstream: installing into $venv (log: $venv/install.log)" >&2
  if ! command -v cargo >/dev/null 2>&1; then
    echo "fairstream: no cargo (Rust) found: installing without the compiled path; everything runs in Python, slower (Rust: https://rustup.rs)" >&2
  fi
  if ! { "$venv/bin/python" -m pip install --upgrade pip && "$venv/bin/python" -m pip install -e "$root[test,compile,lint]"; } \
      > "$venv/install.log" 2>&1; then
    tail -n 30 "$venv/install.log" >&2
    echo "fairstream: installation failed (full log: $venv/install.log)" >&2
    exit 1
  fi
  touch "$stamp"
fi
# The engine's modules compiled with mypyc (fairstream/compiled.py): compiled again when one of
# them changed (about 30 s), else nothing; without a C compiler they run from source.
"$venv/bin/python" "$root/scripts/compile.py"
