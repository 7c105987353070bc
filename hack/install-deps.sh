#!/usr/bin/env bash
# Install what the collection needs on a Debian/Ubuntu machine (run as root), into the cache root:
#   hack/install-deps.sh               everything `make test` uses: every Debian package of hack/apt-packages.txt, a
#                                      Python virtualenv with requirements-test.txt, the ansible-test sanity venv
#   hack/install-deps.sh --quickstart  what `make quickstart` uses: the packages before "[test]" in
#                                      hack/apt-packages.txt and requirements.txt (no Ceph, containerd, iperf3,
#                                      apt-cacher-ng, host kernel, test tools or sanity venv)
# and links the checkout as an Ansible collection. Idempotent: a second run only checks (apt and pip no-op when
# satisfied; a full install satisfies --quickstart). pip prints what it collects and installs (no progress bars).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
cache=${ZJUSCT_CACHE:-/var/cache/zjusct-cloud}
profile=test
case "${1:-}" in
  --quickstart) profile=quickstart ;;
  "") ;;
  *) echo "usage: $0 [--quickstart]" >&2; exit 2 ;;
esac
mkdir -p "$cache"

package_lines() { # the list's lines for this profile: --quickstart stops at "[test]"
  if [ "$profile" = quickstart ]; then sed '/^\[test\]$/q' "$here/hack/apt-packages.txt"; else cat "$here/hack/apt-packages.txt"; fi
}
mapfile -t pkgs < <(package_lines | grep -v '^\s*#' | grep -v '^\s*$' | grep -vx '\[test\]')
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
# The stamps record what was installed: requirements.txt + the launcher (quickstart), or all of it (test).
stamp_test="$venv/.requirements.sha256"
stamp_run="$venv/.requirements-run.sha256"
want_test=$(cat "$here/requirements.txt" "$here/requirements-test.txt" "$here/launcher/pyproject.toml" | sha256sum | cut -d' ' -f1)
want_run=$(cat "$here/requirements.txt" "$here/launcher/pyproject.toml" | sha256sum | cut -d' ' -f1)
pip_install() { "$venv/bin/pip" install --progress-bar off --disable-pip-version-check "$@"; }
if [ "$(cat "$stamp_test" 2>/dev/null)" = "$want_test" ] \
    || { [ "$profile" = quickstart ] && [ "$(cat "$stamp_run" 2>/dev/null)" = "$want_run" ]; }; then
  echo "==> python: requirements satisfied ($venv)"
else
  if [ "$profile" = quickstart ]; then reqs=requirements.txt; else reqs=requirements-test.txt; fi
  echo "==> python: installing $reqs into $venv"
  pip_install -q --upgrade pip
  pip_install -r "$here/$reqs"
  pip_install -e "$here/launcher"
  echo "$want_run" > "$stamp_run"
  if [ "$profile" = test ]; then echo "$want_test" > "$stamp_test"; fi
fi
if [ "$profile" = quickstart ]; then
  "$here/hack/setup-collection.sh"
  exit 0
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
