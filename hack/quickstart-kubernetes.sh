#!/usr/bin/env bash
# The README's third command (`make quickstart-kubernetes`): the Kubernetes backend on this one machine, as an
# operator without a cluster of their own tries it (docs/kubernetes.md):
#   a local cluster (hack/cluster.sh: control plane, two real nodes, kube-proxy, kube-router, Ceph with 3 OSDs)
#   -> the launcher and controller images imported into every node's containerd (no registry)
#   -> the cephx users and their Secrets (playbooks/ceph_credentials.yml)
#   -> site.yml with the kubernetes backend (CRDs, RBAC, owner policies, the controller Deployment with fencing)
#   -> vm_start.yml -e owner=alice on an RBD root disk, the dynamic inventory, a command in her guest.
# Re-running it is safe: a running local cluster is reused and every step is idempotent (a running VM is left
# alone). Environment: OWNER (default alice), ZJUSCT_LOCALCLUSTER (state dir, default /var/lib/zjusct-localcluster).
# Guests run under TCG: the launcher Pod mounts no /dev/kvm (controller/zjusct_controller/pod.py), and nested KVM does not boot
# guests on these machines anyway.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
export ZJUSCT_CACHE=${ZJUSCT_CACHE:-/var/cache/zjusct-cloud}
export PATH="$ZJUSCT_CACHE/venv/bin:$PATH"
export ANSIBLE_CONFIG="$here/ansible.cfg"
owner=${OWNER:-alice}
state=${ZJUSCT_LOCALCLUSTER:-/var/lib/zjusct-localcluster}
export ZJUSCT_LOCALCLUSTER=$state
# each step says when it starts (seconds since the script started): where a cold or a warm run spends its time
step() { echo "==> $1 (at ${SECONDS} s)"; }

step "1/8 install packages, the Python venv and the collection link (the full set: containerd, Ceph, ...)"
hack/install-deps.sh

step "2/8 build the Kubernetes binaries into $ZJUSCT_CACHE (cached: minutes the first time only)"
hack/build-k8s.sh

step "3/8 the local cluster (hack/cluster.sh up: control plane, 2 nodes, Ceph)"
if hack/cluster.sh status >/dev/null 2>&1; then
  echo "    already running in $state: reused"
else
  hack/cluster.sh up >/dev/null
fi
# what the cluster's status says (one value a line): kubeconfig, Ceph conf, keyring, monitors, the nodes' Pod
# ranges (comma-separated), then each node's containerd socket
mapfile -t cluster < <(hack/cluster.sh status --json | python3 -c '
import json, sys
d = json.load(sys.stdin)
print("\n".join([d["kubeconfig"], d["ceph_conf"], d["ceph_keyring"], d["ceph_mon_host"],
                 ",".join(n["pod_cidr"] for n in d["nodes"].values()),
                 *(n["containerd_address"] for n in d["nodes"].values())]))')
export K8S_AUTH_KUBECONFIG=${cluster[0]} CEPH_CONF=${cluster[1]} CEPH_KEYRING=${cluster[2]} CEPH_USER=admin
mon_host=${cluster[3]}
pod_cidrs=${cluster[4]}
sockets=("${cluster[@]:5}")

json_field() { # json_field FILE KEY: the top-level KEY of the JSON document FILE
  python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$1" "$2"
}

step "4/8 the guest image set (debootstrap: minutes the first time)"
work="$state/quickstart"
mkdir -p "$work"
# Two builds into one image directory at once would wipe each other's build tree: wait for any other build there
# (another quickstart, the tests' guest_image fixture) on the directory's lock, as docs/guest-image.md says.
mkdir -p "$ZJUSCT_CACHE/images"
flock "$ZJUSCT_CACHE/images/.guest_image.lock" \
  ansible-playbook playbooks/guest_image.yml -e "guest_image_dir=$ZJUSCT_CACHE/images" \
  -e "guest_image_report_file=$work/guest-image.json"
image_dir=$(json_field "$work/guest-image.json" path)
cmdline=$(json_field "$image_dir/manifest.json" defaultCmdline)

step "5/8 the launcher and controller images, imported into each node's containerd"
# one run per image: the archive is built (or found) once and imported into every node's containerd
addresses=$(python3 -c 'import json, sys; print(json.dumps(sys.argv[1:]))' "${sockets[@]}")
for kind in launcher controller; do
  ansible-playbook "playbooks/${kind}_image.yml" -e "{\"${kind}_image_containerd_addresses\": $addresses}" \
    -e "${kind}_image_report_file=$work/$kind-image.json"
done
launcher_tag=$(json_field "$work/launcher-image.json" tag)
controller_tag=$(json_field "$work/controller-image.json" key_tag)

step "6/8 cephx users for the VMs' disks and for fencing, their keyrings in Secrets"
ansible-playbook playbooks/ceph_credentials.yml

step "7/8 ansible-playbook site.yml -e zjusct_cloud_backend=kubernetes (CRDs, RBAC, policies, the controller)"
python3 - "$work/site-vars.json" "$launcher_tag" "$controller_tag" "$image_dir" "$cmdline" "$mon_host" \
  "$pod_cidrs" <<'EOF'
import json, sys
path, launcher, controller, image_dir, cmdline, mon_host, pod_cidrs = sys.argv[1:]
json.dump({"zjusct_cloud_backend": "kubernetes",
           "cluster_controller_image": controller,
           "cluster_controller_fence_secret": "cloudvm-fence",
           "cluster_launcher_namespaces": ["default"],
           "cluster_pod_cidrs": pod_cidrs.split(","),
           "cluster_controller_config": {
               "launcherImage": launcher, "imageDir": image_dir, "cmdline": cmdline, "accel": "tcg",
               "ceph": {"monitors": [mon_host], "user": "zjusct-vm", "secretName": "ceph-vm",
                        "fenceUser": "zjusct-fence"}}}, open(path, "w"), indent=2)
EOF
ansible-playbook site.yml -e "@$work/site-vars.json"

key="$HOME/.ssh/id_ed25519"
if [ ! -f "$key" ]; then
  echo "==> creating an SSH key for this operator: $key"
  mkdir -p "$HOME/.ssh" && chmod 700 "$HOME/.ssh"
  ssh-keygen -q -t ed25519 -N '' -f "$key"
fi
export ZJUSCT_CLOUD_BACKEND=kubernetes
step "8/8 start $owner's VM on an RBD root disk: ansible-playbook playbooks/vm_start.yml -e owner=$owner"
ansible-playbook playbooks/vm_start.yml -e "owner=$owner" -e "images_dir=$ZJUSCT_CACHE/images" \
  -e "ssh_public_key_file=$key.pub"
step "the dynamic inventory, and a command inside the guest over SSH"
ansible-inventory -i inventory/kubernetes.cloudvm.yml --graph
ansible -i inventory/kubernetes.cloudvm.yml "owner_$owner" --private-key "$key" -m ansible.builtin.command -a "uname -a"

cat <<EOF
==> done: $owner's VM runs on the local cluster (after ${SECONDS} s). In this shell first:
    export PATH=$ZJUSCT_CACHE/venv/bin:\$PATH ZJUSCT_CLOUD_BACKEND=kubernetes K8S_AUTH_KUBECONFIG=$K8S_AUTH_KUBECONFIG \\
      KUBECONFIG=$K8S_AUTH_KUBECONFIG CEPH_CONF=$CEPH_CONF CEPH_KEYRING=$CEPH_KEYRING CEPH_USER=admin
    where it runs:   ansible-inventory -i inventory/kubernetes.cloudvm.yml --graph
    stop / start:    ansible-playbook playbooks/vm_stop.yml -e owner=$owner   (vm_start.yml as above)
    another VM:      ansible-playbook playbooks/vm_start.yml -e owner=bob -e images_dir=$ZJUSCT_CACHE/images
                     (a new VM's RBD root volume is cloned from the image set there; add -e name=... for more)
    lose its node:   hack/cluster.sh lose-node <node> --how agents   (docs/kubernetes.md "VMs on two nodes")
    drain a node:    ansible localhost -m kubernetes.core.k8s_drain -a '{"name": "<node>", "state": "drain",
                       "delete_options": {"delete_emptydir_data": true, "wait_timeout": 900}}'   (docs/controller.md)
    the cluster:     hack/cluster.sh status | down
EOF
