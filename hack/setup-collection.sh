#!/usr/bin/env bash
# Make the checkout usable as the collection zjusct.cloud without publishing it:
# .collections/ansible_collections/zjusct/cloud -> the repository root (ansible.cfg points there).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
dir="$here/.collections/ansible_collections/zjusct"
mkdir -p "$dir"
if [ "$(readlink "$dir/cloud" 2>/dev/null)" != "$here" ]; then
  ln -sfn "$here" "$dir/cloud"
  echo "==> collection: linked $dir/cloud -> $here"
fi
