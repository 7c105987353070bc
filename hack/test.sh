#!/usr/bin/env bash
# The README's test command (`make test`): set everything up, then run every check and test.
#   1. hack/install-deps.sh        Debian packages, Python venv, collection link (idempotent)
#   2. hack/build-k8s.sh           kube-apiserver/-scheduler/-controller-manager, kubelet + etcd into the cache
#   3. ruff, mypy, ansible-lint (production profile), ansible-test sanity
#   4. pytest: unit, integration (real kube-apiserver, Ceph, netns/tc, QEMU guests) and e2e
# Every step runs even when an earlier one failed; the exit code is non-zero if any failed, and a
# pytest run that collected no test counts as a failure. Extra arguments go to pytest.
# pytest runs the tests in a random order (pytest-random-order: modules shuffled, tests shuffled within
# each module) and prints the seed in its header ("Using --random-order-seed=N"); pass that option to
# repeat an order: `make test` is `hack/test.sh`, so `hack/test.sh tests --random-order-seed=N` (docs/testing.md).
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
export ZJUSCT_CACHE=${ZJUSCT_CACHE:-/var/cache/zjusct-cloud}
venv="$ZJUSCT_CACHE/venv"
failed=()
step() { # step NAME CMD...
  local name=$1; shift
  local t0=$SECONDS
  echo "==> $name"
  if "$@"; then echo "==> $name: ok ($((SECONDS - t0)) s)"; else echo "==> $name: FAILED ($((SECONDS - t0)) s)"; failed+=("$name"); fi
}

hack/install-deps.sh || { echo "==> install-deps: FAILED"; exit 1; }
export PATH="$venv/bin:$PATH"
export ANSIBLE_CONFIG="$here/ansible.cfg"
if [ -x hack/build-k8s.sh ]; then
  step "build-k8s" hack/build-k8s.sh
fi

py_targets=(plugins launcher tests bench controller)
step "ruff" ruff check "${py_targets[@]}"
step "mypy" mypy plugins/module_utils launcher/zjusct_launcher controller/zjusct_controller
step "ansible-lint" ansible-lint --profile production --offline
step "ansible-test sanity" hack/sanity.sh
step "changelog" antsibull-changelog lint

# Molecule scenarios of the roles (extensions/molecule/*, docs/testing.md#molecule); each prints its time.
step "molecule" hack/molecule.sh

if [ "$#" -eq 0 ]; then set -- tests; fi
order=(--random-order-bucket=module)
echo "==> pytest ${order[*]} $*"
t0=$SECONDS
pytest -p no:cacheprovider "${order[@]}" "$@"
rc=$?
echo "==> pytest: exit $rc ($((SECONDS - t0)) s)"
case $rc in
  0) ;;
  5) echo "==> pytest collected no test: failure"; failed+=("pytest(no tests)") ;;
  *) failed+=("pytest") ;;
esac

if ((${#failed[@]})); then
  echo "==> FAILED: ${failed[*]}"
  exit 1
fi
echo "==> all checks passed"
