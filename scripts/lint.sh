#!/usr/bin/env bash
# Style and types, as CI checks them (.ci/run): ruff over the code, tests and scripts, and mypy
# over the whole package as it installs. Settings: pyproject.toml ([tool.ruff], [tool.mypy]).
# `scripts/lint.sh --fix` lets ruff fix what it can first.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/bootstrap.sh" >&2 || exit 1
venv="$root/.venv"
status=0
"$venv/bin/ruff" check ${1:+"$1"} "$root" || status=1
# mypy reads a package from the folders it is in; fairstream's top-level folders install as
# its subpackages (policies/ is fairstream.policies: pyproject.toml's package-dir), so it reads
# a tree of links laid out as the package installs.
stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT
mkdir "$stage/fairstream"
for entry in "$root"/fairstream/*; do
  ln -s "$entry" "$stage/fairstream/$(basename "$entry")"
done
for folder in policies state streams producers kube; do
  ln -s "$root/$folder" "$stage/fairstream/$folder"
done
(cd "$stage" && "$venv/bin/mypy" --config-file "$root/pyproject.toml" --cache-dir "$venv/.mypy_cache" -p fairstream) || status=1
exit "$status"
