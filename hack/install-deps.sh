#!/usr/bin/env bash
# Install everything the collection and its tests need on a Debian/Ubuntu machine (run as root):
# Debian packages from hack/apt-packages.txt, a Python virtualenv with requirements-test.txt
# under the cache root, and the checkout linked as an Ansible collection.
# Idempotent: a second run only checks (apt and pip no-op when satisfied).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
cache=${ZJUSCT_CACHE:-/var/cache/zjusct-cloud}
mkdir -p "$cache"

mapfile -t pkgs < <(grep -v '^\s*#' "$here/hack/apt-packages.txt" | grep -v '^\s*$')
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "==> apt: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  apt-get install -y -q --no-install-recommends "${missing[@]}"
else
  echo "==> apt: all ${#pkgs[@]} packages present"
fi

py=${PYTHON:-python3}
venv="$cache/venv"
if [ ! -x "$venv/bin/python" ]; then
  echo "==> python: creating $venv"
  "$py" -m venv "$venv"
fi
stamp="$venv/.requirements.sha256"
want=$(cat "$here/requirements.txt" "$here/requirements-test.txt" "$here/launcher/pyproject.toml" | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "==> python: installing requirements-test.txt into $venv"
  "$venv/bin/pip" install -q --upgrade pip
  "$venv/bin/pip" install -q -r "$here/requirements-test.txt"
  "$venv/bin/pip" install -q -e "$here/launcher"
  echo "$want" > "$stamp"
else
  echo "==> python: requirements satisfied ($venv)"
fi
# ansible-test sanity runs with --local (its own --requirements would fetch get-pip from a host this
# machine cannot reach): a second venv with the same ansible-core and the sanity tests' pinned tools.
sanity="$cache/venv-sanity"
core=$("$venv/bin/python" -c 'import ansible; print(ansible.__version__)')
reqs=$("$venv/bin/python" -c 'import ansible_test, os; print(os.path.join(os.path.dirname(ansible_test.__file__), "_data", "requirements"))')
want_sanity=$( (echo "$core"; cat "$reqs"/sanity.*.txt) | sha256sum | cut -d' ' -f1)
if [ "$(cat "$sanity/.stamp" 2>/dev/null)" != "$want_sanity" ]; then
  echo "==> python: ansible-test sanity venv ($sanity)"
  rm -rf "$sanity"
  "$py" -m venv "$sanity"
  "$sanity/bin/pip" install -q --upgrade pip
  "$sanity/bin/pip" install -q "ansible-core==$core" $(cat "$reqs"/sanity.*.txt | grep -v '^#' | sort -u)
  echo "$want_sanity" > "$sanity/.stamp"
fi
"$here/hack/setup-collection.sh"
