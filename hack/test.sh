#!/usr/bin/env bash
# The README's test command (`make test`): set everything up, then run every check and test.
#   1. hack/install-deps.sh        Debian packages, Python venv, collection link (idempotent)
#   2. hack/build-k8s.sh           kube-apiserver/-scheduler/-controller-manager, kubelet + etcd into the cache
#   3. ruff, mypy, ansible-lint (production profile), ansible-test sanity
#   4. pytest: unit, integration (real kube-apiserver, Ceph, netns/tc, QEMU guests) and e2e
#      (3 runs in the background while 4 runs; its output follows pytest's)
#   5. Molecule scenarios (in the background): guest_image and hypervisor from the start of pytest's lanes,
#      cluster and images once lane node has ended; their output follows pytest's
# Every step runs even when an earlier one failed; the exit code is non-zero if any failed, and a
# pytest run that collected no test counts as a failure. Extra arguments go to pytest.
# pytest runs the tests in a random order (pytest-random-order: modules shuffled, tests shuffled within
# each module) with one seed, printed ("seed N"); pass it back to repeat the order:
# `hack/test.sh --random-order-seed=N` (every lane, see below; docs/testing.md).
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

py_targets=(plugins launcher tests bench controller extensions localcluster)
# The static checks read only the checkout; they run in the background next to pytest (their output is
# printed after it, each with its own time) instead of before it.
checks_dir=$(mktemp -d)
trap 'rm -rf "$checks_dir"' EXIT
(
  cstep() { # cstep NAME CMD...: like step, the verdict into $checks_dir/failed
    local name=$1; shift
    local t0=$SECONDS
    echo "==> $name"
    if "$@"; then echo "==> $name: ok ($((SECONDS - t0)) s)"; else echo "==> $name: FAILED ($((SECONDS - t0)) s)"; echo "$name" >>"$checks_dir/failed"; fi
  }
  cstep "ruff" ruff check "${py_targets[@]}"
  # mypy's incremental cache outside the checkout: a fresh clone re-checks only the modules whose content changed
  cstep "mypy" mypy --cache-dir "$ZJUSCT_CACHE/mypy-cache" plugins/module_utils launcher/zjusct_launcher controller/zjusct_controller localcluster/zjusct_localcluster
  cstep "ansible-lint" ansible-lint --profile production --offline
  cstep "ansible-test sanity" hack/sanity.sh
  cstep "changelog" antsibull-changelog lint
) >"$checks_dir/log" 2>&1 &
checks_pid=$!

# pytest: modules shuffled, tests shuffled within each module; one seed for the whole run (printed, and
# accepted back as --random-order-seed=N). Every run prints the 40 slowest setups/calls/teardowns.
#
# Without test paths in the arguments pytest runs as three lanes at once (a TCG guest keeps one core busy; much of
# the rest waits on guests, API servers and Ceph): lane "guests" takes the end-to-end modules (the two that run
# site.yml install the launcher to the same /usr/local paths, so they stay in one process), lane "node" the real
# node's tests (tests/integration/k8s_node: one node per machine, serialised by its lock anyway) together with the
# tests that assert the host's net.ipv4.ip_forward unchanged (tests/integration/hostnet,
# tests/e2e/host/test_network_isolation.py: the real node changes it, so none of them runs while the node is up)
# and the local cluster's tests (tests/integration/localcluster: several real nodes under the same lock; run first
# in the session, see tests/conftest.py), lane "rest" the other tests. Each lane is an ordinary pytest session (its own session fixtures: control plane,
# Ceph, guest image check); the tests and what they assert are the same as in one session. Set
# ZJUSCT_TEST_LANES=1 for a single session.
node_lane=(tests/integration/k8s_node tests/integration/hostnet tests/e2e/host/test_network_isolation.py
  tests/integration/localcluster)
# Balance (minutes; the rehearsal of 2026-12-02 11:37 on a fresh machine, all four Molecule scenarios beside the
# lanes: guests 30, node 36, rest 31; the SSH gateway's module, 4.5 of node's minutes, then ran in lane node and now
# runs in lane guests): two end-to-end modules that mostly create stopped VMs (quotas, owner checks) run in lane
# rest.
rest_e2e=(tests/e2e/host/test_owner_authorization.py tests/e2e/host/test_quotas_audit.py)
mapfile -t guest_lane < <(find tests/e2e -name 'test_*.py' | sort \
  | grep -vxF -f <(printf '%s\n' "${node_lane[@]}" "${rest_e2e[@]}"))
# Molecule scenarios of the roles (extensions/molecule/*, docs/testing.md#molecule); each prints its time. A full
# run (no test paths given) runs all four in two background jobs (molecule_job), output to files printed after
# pytest's, a failure recorded with the static checks' verdicts:
# - cluster and images, once lane node has ended (it built both images `images` imports, and its real node and
#   control plane are gone);
# - guest_image (a second debootstrap into a throwaway directory) and hypervisor (a throwaway system container on a
#   copy of the guest image's root file system made a hypervisor), from the start of the lanes: they need neither lane's images, only the default guest image
#   set, which the job first ensures through the fixture's own function under its lock (warm: a check; cold: it
#   waits while a lane builds it, so no two debootstraps share the .deb cache at once).
molecule_pids=()
molecule_job() { # molecule_job NAME CMD...: CMD in the background (full runs only), its output into a file
  [ "$paths" -eq 0 ] || return 0
  local name=$1 log="$checks_dir/molecule-${#molecule_pids[@]}.log"
  shift
  (
    t0=$SECONDS
    echo "==> $name"
    if "$@"; then echo "==> $name: ok ($((SECONDS - t0)) s)"
    else echo "==> $name: FAILED ($((SECONDS - t0)) s)"; echo "$name" >>"$checks_dir/failed"; fi
  ) >"$log" 2>&1 &
  molecule_pids+=("$!")
}
molecule_guest_scenarios() {
  python -c 'from tests.guest_image_fixture import ensure_image_set; ensure_image_set()' \
    && echo "==> guest image set ready ($((SECONDS - t0)) s)" && hack/molecule.sh guest_image hypervisor
}
seed=""
paths=0
for arg in "$@"; do
  case $arg in
    --random-order-seed=*) seed=${arg#--random-order-seed=} ;;
    -*) ;;
    *) [ -e "${arg%%::*}" ] && paths=1 ;;
  esac
done
if [ -z "$seed" ]; then
  seed=$(( (RANDOM << 15 | RANDOM) % 1000000 ))
  set -- "$@" "--random-order-seed=$seed"
fi
order=(--random-order-bucket=module)
common=(-p no:cacheprovider "${order[@]}" --durations=40)
t0=$SECONDS
# How busy the machine's CPUs were while pytest's lanes ran (the first line of /proc/stat every 10 s; summed up at
# the end): whether the run waits on the CPUs (cutting any work shortens it) or on timers and guests (only the
# longest lane's waits count).
( while sleep 10; do head -n 1 /proc/stat; done ) >"$checks_dir/cpu" 2>/dev/null &
cpu_pid=$!
lane_rc() { # lane_rc NAME RC: record a lane's verdict
  echo "==> pytest $1: exit $2"
  case $2 in
    0) ;;
    5) echo "==> pytest $1 collected no test: failure"; failed+=("pytest $1 (no tests)") ;;
    *) failed+=("pytest $1") ;;
  esac
}
if [ "$paths" -eq 1 ] || [ "${ZJUSCT_TEST_LANES:-3}" = 1 ]; then
  if [ "$paths" -eq 0 ]; then set -- tests "$@"; fi
  echo "==> pytest ${order[*]} $* (seed $seed)"
  pytest "${common[@]}" "$@" > >(tee "$checks_dir/single") 2>&1
  lane_rc "" $?
  molecule_job "molecule cluster images" hack/molecule.sh cluster images
  molecule_job "molecule guest_image hypervisor" molecule_guest_scenarios
  sleep 1  # let tee drain
  grep -E "^(FAILED|ERROR) " "$checks_dir/single" >"$checks_dir/pytest-failures"
else
  ignores=()
  for d in "${guest_lane[@]}" "${node_lane[@]}"; do ignores+=("--ignore=$d"); done
  echo "==> pytest in three lanes, seed $seed: lane guests = tests/e2e except ${node_lane[*]:2:1} ${rest_e2e[*]};"
  echo "==>   lane node = ${node_lane[*]}; lane rest = the other tests"
  echo "==>   again: hack/test.sh --random-order-seed=$seed   (lane output is prefixed [guests] / [node] / [rest])"
  logs=$(mktemp -d)
  lanes=(guests node rest)
  declare -A pid rc
  ZJUSCT_TEST_TIMES=$checks_dir/times-guests pytest "${common[@]}" "$@" "${guest_lane[@]}" \
    > >(sed -u 's/^/[guests] /' | tee "$logs/guests") 2>&1 &
  pid[guests]=$!
  ZJUSCT_TEST_TIMES=$checks_dir/times-node pytest "${common[@]}" "$@" "${node_lane[@]}" \
    > >(sed -u 's/^/[node] /' | tee "$logs/node") 2>&1 &
  pid[node]=$!
  ZJUSCT_TEST_TIMES=$checks_dir/times-rest pytest "${common[@]}" "$@" "${ignores[@]}" tests \
    > >(sed -u 's/^/[rest] /' | tee "$logs/rest") 2>&1 &
  pid[rest]=$!
  molecule_job "molecule guest_image hypervisor" molecule_guest_scenarios
  # The Molecule scenarios (below) start as soon as lane node has ended (it built the images `images` imports and
  # its real node is gone), next to the tails of the other lanes rather than after them.
  declare -A ended
  wait "${pid[node]}"; rc[node]=$?; ended[node]=$((SECONDS - t0))
  molecule_job "molecule cluster images" hack/molecule.sh cluster images
  for lane in guests rest; do wait "${pid[$lane]}"; rc[$lane]=$?; ended[$lane]=$((SECONDS - t0)); done
  lane_times="lanes ended after (min): guests $((ended[guests] / 60)), node $((ended[node] / 60)), rest $((ended[rest] / 60))"
  sleep 1  # let the output filters drain
  # a lane whose tests were all deselected (-k, -m) collected nothing: only every lane empty is a failure
  all_empty=1
  for lane in "${lanes[@]}"; do [ "${rc[$lane]}" -ne 5 ] && all_empty=0; done
  for lane in "${lanes[@]}"; do
    if [ "${rc[$lane]}" -eq 5 ] && [ "$all_empty" -eq 0 ]; then rc[$lane]=0; fi
    lane_rc "$lane" "${rc[$lane]}"
  done
  echo "==> pytest lane summaries:"
  for lane in "${lanes[@]}"; do grep -E "=+ .* in [0-9.]+s.* =+" "$logs/$lane" | tail -n 1; done
  # the failing tests' ids, repeated as the last lines of the run (CI keeps only the tail of the output)
  for lane in "${lanes[@]}"; do grep -E "^\[$lane\] (FAILED|ERROR) " "$logs/$lane"; done >"$checks_dir/pytest-failures"
  rm -rf "$logs"
fi
pytest_end=$SECONDS
kill "$cpu_pid" 2>/dev/null
echo "==> pytest: $((SECONDS - t0)) s"

# The Molecule jobs' output follows pytest's (their verdicts are read with the static checks' below).
for i in "${!molecule_pids[@]}"; do
  wait "${molecule_pids[$i]}"
  cat "$checks_dir/molecule-$i.log"
done

wait "$checks_pid"
cat "$checks_dir/log"
if [ -s "$checks_dir/failed" ]; then
  while IFS= read -r name; do failed+=("$name"); done <"$checks_dir/failed"
fi

# where the time went, near the end (CI keeps only the tail): lanes, Molecule and static checks, slowest modules
echo "==> times: total $((SECONDS / 60)) min; pytest $(( (pytest_end - t0) / 60 )) min; ${lane_times:-one session}"
# per 10-s sample: busy = 1 - (idle + iowait) / total jiffies
awk '{t = 0; for (i = 2; i <= 9; i++) t += $i; w = $5 + $6  # user..steal (guest time is within user)
      if (NR > 1 && t > pt) { b = 1 - (w - pw) / (t - pt); sum += b; n++; if (b >= 0.9) full++; io += ($6 - pio) / (t - pt) }
      pt = t; pw = w; pio = $6}
     END {if (n) printf "==> cpu while pytest ran: %.0f %% busy on average, %.0f %% of the time >= 90 %% busy, iowait %.0f %%\n",
          100 * sum / n, 100 * full / n, 100 * io / n}' "$checks_dir/cpu"
grep -hE "^==> (molecule [a-z_]+|ruff|mypy|ansible-lint|ansible-test sanity): (ok|FAILED)" \
  "$checks_dir"/molecule-*.log "$checks_dir/log" 2>/dev/null | tr '\n' ';' | sed 's/==> //g; s/;$/\n/'
if compgen -G "$checks_dir/times-*" >/dev/null; then
  echo "==> slowest test modules (s, lane):"
  for f in "$checks_dir"/times-*; do sed "s|\$| ${f##*/times-}|" "$f"; done | sort -rn | head -n 12 | tr '\n' ';'
  echo
fi
if [ -s "$checks_dir/pytest-failures" ]; then
  echo "==> pytest failures (seed $seed):"
  cut -c1-300 "$checks_dir/pytest-failures"
fi
if ((${#failed[@]})); then
  echo "==> FAILED: ${failed[*]}"
  exit 1
fi
echo "==> all checks passed"
