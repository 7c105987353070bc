#!/usr/bin/env bash
# Run the Molecule scenarios (extensions/molecule/*, docs/testing.md#molecule) one after the other, each
# create -> converge -> idempotence -> verify -> destroy, and print each one's time.
#   hack/molecule.sh                 every scenario
#   hack/molecule.sh cluster         one scenario (same as: molecule test -s cluster)
# Exit code non-zero if any scenario failed, or if there was no scenario to run. A scenario whose real
# component is missing (the test control plane's binaries, QEMU, the guest image) fails in its create step:
# nothing here skips.
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
export ZJUSCT_CACHE=${ZJUSCT_CACHE:-/var/cache/zjusct-cloud}
export PATH="$ZJUSCT_CACHE/venv/bin:$PATH"
export ANSIBLE_CONFIG="$here/ansible.cfg"
export PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}"
if [ "$#" -eq 0 ]; then
  mapfile -t scenarios < <(find extensions/molecule -mindepth 2 -maxdepth 2 -name molecule.yml -printf '%h\n' \
    | xargs -rn1 basename | sort)
else
  scenarios=("$@")
fi
if ((${#scenarios[@]} == 0)); then echo "==> molecule: no scenario found"; exit 1; fi
failed=()
for s in "${scenarios[@]}"; do
  t0=$SECONDS
  echo "==> molecule test -s $s"
  if molecule test -s "$s"; then
    echo "==> molecule $s: ok ($((SECONDS - t0)) s)"
  else
    echo "==> molecule $s: FAILED ($((SECONDS - t0)) s)"
    failed+=("$s")
  fi
done
if ((${#failed[@]})); then echo "==> molecule FAILED: ${failed[*]}"; exit 1; fi
echo "==> molecule: ${#scenarios[@]} passed, 0 failed"
