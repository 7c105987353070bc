#!/usr/bin/env bash
# The README's first command (`make quickstart`): set this machine up as a single-host zjusct.cloud,
# start alice's VM, list it through the dynamic inventory and run a command inside it over SSH.
# Re-running it is safe: every step is idempotent (a running VM is left alone).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
export ZJUSCT_CACHE=${ZJUSCT_CACHE:-/var/cache/zjusct-cloud}
export PATH="$ZJUSCT_CACHE/venv/bin:$PATH"
export ANSIBLE_CONFIG="$here/ansible.cfg"
owner=${OWNER:-alice}

echo "==> 1/5 install packages, Python venv and the collection link (only what this needs: make test adds the rest)"
hack/install-deps.sh --quickstart

echo "==> 2/5 bring this host up: ansible-playbook site.yml (the guest image takes minutes the first time)"
# The guest image's debootstrap is one Ansible task, which prints only when it ends (minutes on a cold download
# cache or a slow mirror). Meanwhile this says every 15 s what it has done, read from the build tree: the
# packages in its apt archive and the dpkg lines of its debootstrap.log (both exist only while debootstrap runs;
# a tree a killed build left behind, older than this run, is not reported).
debootstrap_progress() {
  local root log fetched unpacked set_up sleeper="" since
  since=$(date +%s)
  trap 'kill $sleeper 2>/dev/null; exit 0' TERM
  while :; do
    sleep 15 & sleeper=$!
    wait "$sleeper"
    for root in "$ZJUSCT_CACHE"/images/.build-*/root; do
      log="$root/debootstrap/debootstrap.log"
      [ -d "$root/debootstrap" ] || continue
      [ "$(stat -c %Y "$root/debootstrap" 2>/dev/null || echo 0)" -ge "$since" ] || continue
      # (each may vanish under it when debootstrap ends: no count is an error)
      fetched=$(find "$root/var/cache/apt/archives" -maxdepth 1 -name '*.deb' 2>/dev/null | wc -l) || true
      unpacked=$(grep -c '^Unpacking ' "$log" 2>/dev/null) || true
      set_up=$(grep -c '^Setting up ' "$log" 2>/dev/null) || true
      echo "    ... debootstrap: ${fetched:-0} packages fetched, ${unpacked:-0} unpacked, ${set_up:-0} set up"
    done
  done
}
debootstrap_progress &
progress=$!
trap 'kill $progress 2>/dev/null || true' EXIT
# Image sets are kept in the cache so the quickstart and the tests share one build. The choice is written where
# every later `ansible-playbook site.yml` from this checkout reads it (host variables next to site.yml, not in git):
# a plain site.yml run, such as the README's SSH gateway command, keeps the image directory instead of building the
# image again elsewhere and pointing the host configuration there.
mkdir -p host_vars/localhost
cat >host_vars/localhost/quickstart.yml <<EOF
---
# Written by hack/quickstart.sh (make quickstart): the image directory this host's site.yml runs use.
hypervisor_images_dir: $ZJUSCT_CACHE/images
EOF
ansible-playbook site.yml "$@"
kill "$progress" 2>/dev/null || true
wait "$progress" || true
trap - EXIT

key="$HOME/.ssh/id_ed25519"
if [ ! -f "$key" ]; then
  echo "==> creating an SSH key for this operator: $key"
  mkdir -p "$HOME/.ssh" && chmod 700 "$HOME/.ssh"
  ssh-keygen -q -t ed25519 -N '' -f "$key"
fi

echo "==> 3/5 start $owner's VM: ansible-playbook playbooks/vm_start.yml -e owner=$owner"
ansible-playbook playbooks/vm_start.yml -e "owner=$owner" -e "ssh_public_key_file=$key.pub"

echo "==> 4/5 list running VMs through the dynamic inventory"
if [ -f plugins/inventory/cloudvm.py ] && [ -f inventory/cloudvm.yml ]; then
  ansible-inventory -i inventory/cloudvm.yml --graph
  echo "==> 5/5 run a command inside the guest over SSH"
  ansible -i inventory/cloudvm.yml "owner_$owner" -m ansible.builtin.command -a "uname -a"
else
  echo "    the inventory plugin is not there yet: reaching the guest directly instead"
  ip=$(ansible localhost -m zjusct.cloud.cloudvm_info -a "name=$owner" -o | sed -n 's/.*"sshEndpoint": {"host": "\([0-9.]*\)".*/\1/p' | head -1)
  echo "==> 5/5 run a command inside the guest over SSH ($ip)"
  ip netns exec zjusct-cloud ssh -i "$key" -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null root@"$ip" uname -a
fi
echo "==> done: $owner's VM is running. With the virtualenv on PATH (export PATH=$ZJUSCT_CACHE/venv/bin:\$PATH):"
echo "    stop it:     ansible-playbook playbooks/vm_stop.yml -e owner=$owner"
echo "    back it up:  ansible-playbook playbooks/vm_backup.yml -e owner=$owner -e stop_if_running=true   (prints the backup id)"
echo "    restore it:  ansible-playbook playbooks/vm_restore.yml -e backup=<id>   (a new VM $owner-restored; docs/backup-restore.md)"
