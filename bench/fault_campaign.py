#!/usr/bin/env python3
"""A fault campaign on the cluster of ``make quickstart-kubernetes`` with three nodes: node losses injected at random
moments of alice's VM's life, each followed by the operator's documented recovery (docs/kubernetes.md, "VMs on two
nodes"; docs/controller.md, Fencing), and checked for the three things her users care about.

Each round picks a moment and a way to lose a node (``hack/cluster.sh lose-node --how agents|poweroff|partition``),
seeded (``--seed``, printed):

* ``running``: her VM Running, its guest appending to a file and syncing every second; after 0-20 s its node is lost;
* ``booting``: ``vm_stop.yml``, then ``vm_start.yml`` in the background; 0-25 s after its launcher Pod is bound, that
  node is lost (the guest is somewhere in firmware, kernel or user space);
* ``stopping``: ``vm_stop.yml`` in the background; 0-6 s later her node is lost;
* ``fence``: her node is lost; once it is NotReady the operator taints it out-of-service and starts ``vm_start.yml``
  in the background; 0-3 s later a second node is lost, the controller's own if it is another (a loss while the
  controller fences the first node's client and the scheduler places her new Pod);
* ``controller-restart``: the controller's Pod is deleted (the Deployment makes another); 0-5 s later her node is lost.

Before the loss the round writes a token file in her guest and syncs it. A background ``vm_start.yml``/``vm_stop.yml``
is stopped with SIGINT at the loss (an operator's Ctrl-C: the API write it made stays). Recovery is what
docs/kubernetes.md tells an operator: once each lost node is NotReady, ``kubernetes.core.k8s_taint`` with
``node.kubernetes.io/out-of-service``, then ``vm_start.yml`` (returns when her SSH answers; repeated up to three times
if it fails). Then it checks: her VM Running on a node that was not lost; every token written so far, this round's
and all earlier rounds', in her guest (no synced write lost); and, sampled every second from before the loss to the
end of the recovery, the image's watchers and exclusive-lock owners that are not in the OSD blocklist: at most one at
every sample. Then the lost nodes come back (``restore-node``) and lose their taint.

Prints one JSON line per round and a summary: losses survived out of losses injected, where a round survives when all
three checks hold. docs/kubernetes.md keeps the record.

Usage (root, from the repository root, after ``hack/cluster.sh up --nodes 3`` and ``make quickstart-kubernetes``):
  /var/cache/zjusct-cloud/venv/bin/python bench/fault_campaign.py [--rounds 20] [--seed N] [--owner alice] [--json F]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Optional

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / ".collections"))

import benchlib  # noqa: E402  (bench/, first on sys.path as the script's directory)
from ansible_collections.zjusct.cloud.plugins.module_utils.model.spec import GROUP, PLURAL, VERSION  # noqa: E402
from ansible_collections.zjusct.cloud.plugins.module_utils.storage.rbd import Connection, ImageRef, Rbd  # noqa: E402

from tests.cluster import wait_for  # noqa: E402
from tests.integration.k8s_node.controller_helpers import WriterSampler, ssh_argv  # noqa: E402

CLUSTER = str(REPO / "hack" / "cluster.sh")
MOMENTS = ("running", "booting", "stopping", "fence", "controller-restart")
HOWS = ("agents", "poweroff", "partition")
CONTROLLER_NS, CONTROLLER_LABEL = "zjusct-cloud-system", "app.kubernetes.io/name=zjusct-cloud"


class CephCli:
    """``ceph`` with the cluster's admin identity (what :class:`WriterSampler` reads the blocklist with)."""

    def __init__(self, conf: str, keyring: str) -> None:
        self.base = ["ceph", "--conf", conf, "--keyring", keyring, "--id", "admin"]

    def ceph(self, *args: str) -> str:
        return subprocess.run([*self.base, *args], capture_output=True, text=True, timeout=120, check=True).stdout


class Campaign:
    def __init__(self, args: argparse.Namespace) -> None:
        from kubernetes import client, config

        venv = Path(sys.executable).parent
        self.status, self.env = benchlib.local_cluster_operator()
        self.venv, self.owner, self.ns = venv, args.owner, "default"
        api = config.new_client_from_config(self.status["kubeconfig"])
        self.core, self.custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
        self.ceph = CephCli(self.status["ceph_conf"], self.status["ceph_keyring"])
        self.rbd = Rbd(Connection(conf=self.status["ceph_conf"], keyring=self.status["ceph_keyring"], timeout=120))
        self.key = Path(args.key).expanduser()
        self.tokens: dict[str, str] = {}
        self.rng = random.Random(args.seed)

    # --- what the operator types -------------------------------------------------------------------------------
    def playbook(self, name: str) -> list[str]:
        return [str(self.venv / "ansible-playbook"), f"playbooks/{name}.yml", "-e", f"owner={self.owner}"]

    def run(self, argv: list[str], timeout: float = 1800) -> subprocess.CompletedProcess:
        return subprocess.run(argv, cwd=REPO, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, timeout=timeout, check=False)

    def background(self, name: str) -> subprocess.Popen:
        return subprocess.Popen(self.playbook(name), cwd=REPO, env=self.env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)

    def taint(self, node: str, state: str) -> None:
        out = self.run(benchlib.taint_argv(node, state))
        if out.returncode != 0:
            raise RuntimeError(f"k8s_taint {node} {state}: {out.stdout[-2000:]}")

    def lose(self, node: str, how: str) -> None:
        out = self.run([CLUSTER, "lose-node", node, "--how", how])
        if out.returncode != 0:
            raise RuntimeError(f"lose-node {node}: {out.stdout[-2000:]}")

    # --- what the checks read ----------------------------------------------------------------------------------
    def vm(self) -> dict[str, Any]:
        return dict(self.custom.get_namespaced_custom_object(GROUP, VERSION, self.ns, PLURAL, self.owner))

    def ready_nodes(self) -> set[str]:
        return {n.metadata.name for n in self.core.list_node().items
                if any(c.type == "Ready" and c.status == "True" for c in n.status.conditions or [])}

    def image(self) -> ImageRef:
        claim = self.core.read_namespaced_persistent_volume_claim(self.vm()["spec"]["rootVolumeClaim"], self.ns)
        attrs = self.core.read_persistent_volume(claim.spec.volume_name).spec.csi.volume_attributes
        return ImageRef(attrs["pool"], attrs["imageName"])

    def controller_node(self) -> Optional[str]:
        pods = self.core.list_namespaced_pod(CONTROLLER_NS, label_selector=CONTROLLER_LABEL).items
        live = [p for p in pods if p.metadata.deletion_timestamp is None and p.spec.node_name]
        return live[0].spec.node_name if live else None

    def ssh(self, command: str, timeout: float = 120) -> subprocess.CompletedProcess:
        host = self.vm()["status"]["sshEndpoint"]["host"]
        return subprocess.run(ssh_argv(self.key, host, command, connect_timeout=30), capture_output=True,
                              text=True, timeout=timeout, check=False)

    def running_on_live_node(self, lost: set[str]) -> Optional[str]:
        st = self.vm().get("status") or {}
        if st.get("phase") == "Running" and st.get("node") not in lost:
            return str(st["node"])
        return None

    # --- one round ---------------------------------------------------------------------------------------------
    def ensure_running(self) -> None:
        if not self.running_on_live_node(set()):
            out = self.run(self.playbook("vm_start"))
            if out.returncode != 0:
                raise RuntimeError(f"vm_start before the round: {out.stdout[-3000:]}")

    def write_token(self, round_no: int) -> None:
        token = uuid.uuid4().hex
        path = f"/root/campaign-{round_no}"
        out = self.ssh(f"echo {token} > {path} && sync && cat {path}")
        if out.returncode != 0 or out.stdout.strip() != token:
            raise RuntimeError(f"token {path}: {out.returncode} {out.stdout!r} {out.stderr[-500:]!r}")
        self.tokens[path] = token

    def inject(self, moment: str, how: str) -> tuple[list[str], dict[str, Any]]:
        """The loss(es) of ``moment``; returns the nodes lost and what the VM's spec and status said at the loss."""
        rng, bg = self.rng, None
        vm_node = str(self.vm()["status"]["node"])
        lost: list[str] = []
        if moment == "running":
            self.ssh("nohup sh -c 'while :; do date >> /root/appending; sync; sleep 1; done' >/dev/null 2>&1 &")
            time.sleep(rng.uniform(0, 20))
            lost.append(vm_node)
        elif moment == "booting":
            out = self.run(self.playbook("vm_stop"))
            if out.returncode != 0:
                raise RuntimeError(f"vm_stop before a boot: {out.stdout[-3000:]}")
            boot = int(self.vm()["spec"].get("bootID", 0))
            bg = self.background("vm_start")
            node = wait_for(lambda: (st := self.vm().get("status") or {}).get("bootID", 0) > boot
                            and st.get("node"), 600, "her new boot's Pod bound", 0.5)
            time.sleep(rng.uniform(0, 25))
            vm_node = str(node)
            lost.append(vm_node)
        elif moment == "stopping":
            bg = self.background("vm_stop")
            time.sleep(rng.uniform(0, 6))
            lost.append(vm_node)
        elif moment == "controller-restart":
            self.core.delete_collection_namespaced_pod(CONTROLLER_NS, label_selector=CONTROLLER_LABEL)
            time.sleep(rng.uniform(0, 5))
            lost.append(vm_node)
        elif moment == "fence":
            self.lose(vm_node, how)
            wait_for(lambda: vm_node not in self.ready_nodes(), 300, f"{vm_node} NotReady", 1.0)
            self.taint(vm_node, "present")
            bg = self.background("vm_start")
            time.sleep(rng.uniform(0, 3))
            ctl = self.controller_node()
            second = ctl if ctl and ctl != vm_node else next(n for n in sorted(self.ready_nodes()) if n != vm_node)
            lost, vm_node = [vm_node, second], second
        vm = self.vm()
        at_loss = {"powerState": vm["spec"].get("powerState"), "bootID": vm["spec"].get("bootID"),
                   "phase": (vm.get("status") or {}).get("phase"), "node": (vm.get("status") or {}).get("node")}
        self.lose(vm_node, how)
        if bg is not None:
            bg.send_signal(signal.SIGINT)
            try:
                bg.wait(60)
            except subprocess.TimeoutExpired:
                bg.kill()
                bg.wait()
        return lost, at_loss

    def recover(self, lost: list[str]) -> tuple[int, str]:
        """The documented recovery; returns (vm_start runs, the node she runs on)."""
        for node in lost:
            wait_for(lambda node=node: node not in self.ready_nodes(), 300, f"{node} NotReady", 1.0)
            self.taint(node, "present")
        for attempt in range(1, 4):
            out = self.run(self.playbook("vm_start"))
            node = self.running_on_live_node(set(lost))
            if out.returncode == 0 and node:
                return attempt, node
            print(f"    vm_start attempt {attempt}: rc {out.returncode}, status {self.vm().get('status')}; "
                  f"{out.stdout[-800:]}", flush=True)
        raise RuntimeError(f"not Running on a live node after 3 vm_start runs: {self.vm().get('status')}")

    def tokens_present(self) -> list[str]:
        """The token files that are missing or differ (empty: none lost)."""
        listing = " ".join(shlex.quote(p) for p in self.tokens)
        out = self.ssh(f"for f in {listing}; do printf '%s %s\\n' \"$f\" \"$(cat \"$f\" 2>/dev/null)\"; done")
        got = dict(line.split(" ", 1) for line in out.stdout.splitlines() if " " in line)
        return [p for p, t in self.tokens.items() if got.get(p, "").strip() != t]

    def restore(self, lost: list[str]) -> None:
        for node in lost:
            out = self.run([CLUSTER, "restore-node", node])
            if out.returncode != 0:
                raise RuntimeError(f"restore-node {node}: {out.stdout[-2000:]}")
            self.taint(node, "absent")
        wait_for(lambda: set(self.status["nodes"]) <= self.ready_nodes(), 300, "every node Ready", 1.0)

    def round(self, no: int, moment: str, how: str) -> dict[str, Any]:
        row: dict[str, Any] = {"round": no, "moment": moment, "how": how}
        try:
            self.ensure_running()
            self.write_token(no)
        except Exception as exc:  # an earlier round left her VM unreachable: recorded, nothing injected
            row.update(error=f"before the loss: {exc}"[:1500], survived=False)
            self.restore(sorted(set(self.status["nodes"]) - self.ready_nodes()))
            return row
        t0 = time.monotonic()
        with WriterSampler(self.rbd, self.image(), self.ceph) as writers:
            try:
                lost, row["at_loss"] = self.inject(moment, how)
                row["lost"] = lost
                row["vm_starts"], row["now_on"] = self.recover(lost)
                row["recovered_s"] = round(time.monotonic() - t0, 1)
            except Exception as exc:  # the round failed; the campaign goes on after restoring
                row["error"] = str(exc)[:1500]
                lost = sorted(set(self.status["nodes"]) - self.ready_nodes())
        row["missing_tokens"] = self.tokens_present() if "error" not in row else None
        row["most_live_writers"], row["samples"] = writers.most_live(), len(writers.samples)
        # every sample with two or more holders not blocklisted: seconds from the round's start and the holders
        row["two_writers_at"] = [(round(t - t0, 1), live) for t, live in writers.samples if len(live) > 1]
        row["survived"] = ("error" not in row and row["missing_tokens"] == [] and row["most_live_writers"] <= 1)
        self.restore(lost)
        return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--seed", type=int, default=random.SystemRandom().randrange(1, 1_000_000))
    ap.add_argument("--owner", default="alice")
    ap.add_argument("--key", default="~/.ssh/id_ed25519", help="the private key of her VM's authorized key")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    campaign = Campaign(args)
    if len(campaign.status["nodes"]) < 3:
        raise SystemExit("fault_campaign: the 'fence' moment loses two nodes; run hack/cluster.sh up --nodes 3 "
                         "before make quickstart-kubernetes")
    print(f"seed {args.seed}", flush=True)
    plan = [(MOMENTS[i % len(MOMENTS)], campaign.rng.choice(HOWS)) for i in range(args.rounds)]
    campaign.rng.shuffle(plan)
    rows = []
    for no, (moment, how) in enumerate(plan, start=1):
        rows.append(campaign.round(no, moment, how))
        print(json.dumps(rows[-1]), flush=True)
    survived = sum(1 for r in rows if r["survived"])
    injected = sum(len(r.get("lost") or ()) for r in rows)
    summary = {"seed": args.seed, "rounds": rows, "rounds_survived": survived, "losses_injected": injected,
               "load_avg": os.getloadavg()}
    print(f"rounds survived {survived} of {len(rows)} ({injected} node losses injected); seed {args.seed}; "
          f"load {os.getloadavg()[0]:.1f}")
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2))
    return 0 if survived == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
