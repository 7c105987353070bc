#!/usr/bin/env bash
# ansible-test sanity needs the collection at ansible_collections/zjusct/cloud: copy the tracked and
# untracked-but-not-ignored files there (a symlink is not enough: ansible-test resolves the real path).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
dest="$work/ansible_collections/zjusct/cloud"
mkdir -p "$dest"
(cd "$here" && git ls-files -z --cached --others --exclude-standard | while IFS= read -r -d '' f; do [ -e "$f" ] && printf '%s\0' "$f"; done | xargs -0 cp --parents -t "$dest")
cd "$dest"
git init -q && git add -A >/dev/null 2>&1 || true
ansible-test sanity --python "$(python3 -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')" \
  --requirements --color no "$@"
