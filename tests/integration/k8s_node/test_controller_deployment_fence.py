"""site.yml deploys the controller with a fence identity (``cluster_controller_fence_secret``, docs/controller.md
"Fencing" and "Deployment") on the real control plane + real node, and the in-cluster controller can fence: the
keyring Secret is mounted read-only (mode 0440, group 65534 through fsGroup, readable by the controller's user,
root file system still read-only), controller.json's ``ceph.fenceKeyring`` points at it, and the controller's
own fence adapter (``zjusct_controller.fence.Fencer``, the ``rbd`` and ``ceph`` commands of the image's
ceph-common) run inside the controller Pod blocklists a client on a real Ceph cluster reachable from Pods
(``pod_ceph``); a second site.yml run changes nothing. A whole node loss fenced through the Deployment is not
run here (test_controller_fencing.py covers the logic with the controller as a process).
"""

from __future__ import annotations

import contextlib
import json
import subprocess
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from kubernetes.stream import stream

from tests.ceph import Cluster as CephCluster
from tests.cluster import Cluster, RealNode
from tests.integration.k8s_node.test_controller_deployment import changed_tasks, run_site

pytestmark = [pytest.mark.k8s, pytest.mark.kubelet, pytest.mark.ceph, pytest.mark.slow, pytest.mark.timeout(2400)]
NS = "zjusct-cloud-system"
FENCE_USER = "zjusct-fence"
SECRET = "cloudvm-fence"
KEYRING = "/etc/zjusct-controller-fence/keyring"
# The controller's fence adapter as the controller runs it: its config file, CephConfig, Fencer (argv of rbd/ceph).
IN_POD = """
import json, sys
from zjusct_controller.config import CephConfig
from zjusct_controller.fence import Fencer
cfg = json.load(open("/etc/zjusct-controller/controller.json"))
target = json.loads(sys.argv[1])
print("FENCED " + json.dumps(Fencer(CephConfig.from_dict(cfg["ceph"])).fence(target)))
"""


def pod_exec(core: Any, pod: str, argv: list[str]) -> str:
    return str(stream(core.connect_get_namespaced_pod_exec, pod, NS, command=argv, stderr=True, stdin=False,
                      stdout=True, tty=False))


def test_site_deploys_the_controller_with_a_fence_keyring_and_the_pod_fences_on_real_ceph(
    k8s_cluster: Cluster, k8s_api: Any, real_node: RealNode, controller_image: dict[str, Any],
    service_route: None, pod_ceph: CephCluster,
) -> None:
    core, apps = client.CoreV1Api(k8s_api), client.AppsV1Api(k8s_api)
    keyring = pod_ceph.ceph("auth", "get-or-create", f"client.{FENCE_USER}", "mon", "profile rbd", "osd",
                            "profile rbd pool=rbd")
    with contextlib.suppress(ApiException):  # site.yml labels it; the Secret must exist before
        core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
    core.create_namespaced_secret(NS, {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": SECRET},
                                       "type": "Opaque", "stringData": {"keyring": keyring}})
    subprocess.run(["rbd", "-c", str(pod_ceph.conf), "create", "--size", "16M", "rbd/fence-me"], check=True,
                   timeout=120)
    placement = real_node.pod_placement()
    extra = {"cluster_controller_image": controller_image["key_tag"],
             "cluster_controller_config": {"launcherImage": "localhost/zjusct/launcher:0.1.0",
                                           "imageDir": "/nonexistent", "cmdline": "console=ttyS0",
                                           "ceph": {"monitors": [pod_ceph.mon_host], "user": "vm",
                                                    "secretName": "ceph-vm", "fenceUser": FENCE_USER}},
             "cluster_controller_fence_secret": SECRET,
             "cluster_controller_node_selector": placement["nodeSelector"],
             "cluster_controller_tolerations": placement["tolerations"]}
    try:
        first = run_site(k8s_cluster.kubeconfig, extra)
        assert first["stats"]["localhost"]["changed"] >= 1
        config = json.loads(core.read_namespaced_config_map("cloudvm-controller", NS).data["controller.json"])
        assert config["ceph"]["fenceKeyring"] == KEYRING and config["ceph"]["fenceUser"] == FENCE_USER
        dep = apps.read_namespaced_deployment("cloudvm-controller", NS)
        assert {c.type: c.status for c in dep.status.conditions}.get("Available") == "True"
        (pod,) = core.list_namespaced_pod(NS, label_selector="app.kubernetes.io/component=controller").items
        assert pod.spec.node_name == "real-node" and pod.status.phase == "Running"
        sc = pod.spec.containers[0].security_context
        assert (sc.read_only_root_filesystem, sc.allow_privilege_escalation, sc.capabilities.drop) == (
            True, False, ["ALL"])
        assert (pod.spec.security_context.run_as_user, pod.spec.security_context.fs_group) == (65534, 65534)
        name = pod.metadata.name

        # the keyring file: root-owned, group 65534, 0440, readable by the controller's user; its mount read-only
        ident = pod_exec(core, name, ["/bin/sh", "-c", f"id -u; stat -L -c '%a %u %g' {KEYRING}; "
                                      f"head -c 0 {KEYRING} && echo readable; "
                                      f"awk '$2 == \"{KEYRING.rsplit('/', 1)[0]}\" {{print $4}}' /proc/self/mounts"
                                      " | cut -d, -f1; command -v rbd; command -v ceph"])
        lines = ident.splitlines()
        assert lines == ["65534", "440 0 65534", "readable", "ro", "/usr/bin/rbd", "/usr/bin/ceph"], ident

        # the ceph CLI with the mounted keyring, then the controller's fence adapter, inside the Pod
        ls = pod_exec(core, name, ["/bin/sh", "-c", f"printf '[global]\\nmon_host = {pod_ceph.mon_host}\\n' "
                                   f"> /tmp/c.conf && ceph --conf /tmp/c.conf --id {FENCE_USER} --keyring {KEYRING} "
                                   "osd blocklist ls; echo rc=$?"])
        assert "rc=0" in ls, ls
        target = {"pod": "old-launcher", "uid": "u1", "node": "lost-node", "podIP": "10.233.0.250",
                  "pool": "rbd", "image": "fence-me"}
        out = pod_exec(core, name, ["python3", "-c", IN_POD, json.dumps(target)])
        fenced = next((json.loads(line.split(" ", 1)[1]) for line in out.splitlines()
                       if line.startswith("FENCED ")), None)
        assert fenced == ["10.233.0.250:0/0"], out  # no watcher of that IP: the whole Pod IP
        assert "10.233.0.250:0/0" in pod_ceph.ceph("osd", "blocklist", "ls"), "not blocklisted on the cluster"

        second = run_site(k8s_cluster.kubeconfig, extra)
        assert second["stats"]["localhost"]["changed"] == 0, changed_tasks(second)
    finally:
        with contextlib.suppress(Exception):
            print(core.read_namespaced_pod_log(
                core.list_namespaced_pod(NS).items[0].metadata.name, NS)[-4000:])
        with contextlib.suppress(Exception):
            apps.delete_namespaced_deployment("cloudvm-controller", NS)
        with contextlib.suppress(Exception):
            core.delete_namespaced_secret(SECRET, NS)
