#!/usr/bin/env bash
# ansible-test sanity needs the collection at ansible_collections/zjusct/cloud: copy the tracked and
# untracked-but-not-ignored files there (a symlink is not enough: ansible-test resolves the real path).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
dest="$work/ansible_collections/zjusct/cloud"
mkdir -p "$dest"
# Only what the collection ships: galaxy.yml's build_ignore keeps tests/, bench/, hack/, .ci/ and localcluster/ out of
# the artefact, and they are checked by ruff and mypy instead.
(cd "$here" && git ls-files -z --cached --others --exclude-standard -- . ':!tests' ':!bench' ':!hack' ':!.ci' ':!localcluster' \
  | while IFS= read -r -d '' f; do [ -e "$f" ] && printf '%s\0' "$f"; done | xargs -0 cp --parents -t "$dest")
mkdir -p "$dest/tests" && cp -r "$here/tests/sanity" "$dest/tests/"  # ignore files with their reasons
# Dependencies (galaxy.yml) next to the collection, as ansible-test expects: kubernetes.core from the
# community `ansible` package in the main venv.
deps=$("${ZJUSCT_CACHE:-/var/cache/zjusct-cloud}/venv/bin/python" -c 'import ansible_collections, os; print(os.path.dirname(ansible_collections.__file__ or list(ansible_collections.__path__)[0]))' 2>/dev/null || true)
for dep in kubernetes/core; do
  mkdir -p "$work/ansible_collections/${dep%/*}"
  ln -s "$deps/ansible_collections/$dep" "$work/ansible_collections/$dep"
done
cd "$dest"
git init -q && git add -A >/dev/null 2>&1 || true
sanity=${ZJUSCT_CACHE:-/var/cache/zjusct-cloud}/venv-sanity
pip_version=$("$sanity/bin/python" - <<'PY'
import os, re, ansible_test
src = open(os.path.join(os.path.dirname(ansible_test.__file__), "_internal", "python_requirements.py")).read()
print(re.search(r"pip='([0-9.]+)'", src).group(1))
PY
)
mkdir -p ~/.ansible/test/cache
cp "$here/hack/get_pip_offline.py" ~/.ansible/test/cache/get_pip_"${pip_version//./_}".py
export PATH="$sanity/bin:$PATH"
ansible-test sanity --local --python "$("$sanity/bin/python" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')" \
  --color no "$@"
