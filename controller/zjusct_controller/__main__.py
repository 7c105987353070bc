"""``python -m zjusct_controller --config FILE [--kubeconfig FILE] [--namespace NS] [--leader-elect NS/NAME]``
(docs/controller.md)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import socket
import sys
from pathlib import Path

import kopf
from kubernetes import client, config

from .config import Config
from .leader import LeaderElector
from .metrics import Metrics
from .operator import MAX_WORKERS, install
from .reconcile import Reconciler


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, load the launcher defaults and the API credentials, run the operator until signalled."""
    ap = argparse.ArgumentParser(prog="zjusct_controller", description=__doc__)
    ap.add_argument("--config", required=True, type=Path, help="launcher defaults, JSON (docs/controller.md)")
    ap.add_argument("--kubeconfig", help="kubeconfig file; default: in-cluster, then ~/.kube/config")
    ap.add_argument("--namespace", action="append", default=[],
                    help="watch only this namespace (repeatable); default: all namespaces")
    ap.add_argument("--resync", type=float, default=30.0, help="seconds between full resyncs (default 30)")
    ap.add_argument("--metrics-port", type=int, default=0,
                    help="serve Prometheus metrics on /metrics of this port (default 0: off)")
    ap.add_argument("--metrics-address", default="127.0.0.1",
                    help="address of the metrics port (default 127.0.0.1; a Pod uses its own address)")
    ap.add_argument("--leader-elect", metavar="NAMESPACE/NAME",
                    help="reconcile only while holding this coordination.k8s.io Lease (default: no election)")
    ap.add_argument("--identity", default=os.environ.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}",
                    help="this candidate's name in the Lease (default: $POD_NAME, else host-pid)")
    ap.add_argument("--lease-seconds", type=int, default=15, help="Lease duration (default 15)")
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    if not args.verbose:  # kopf logs every handler run at INFO; the controller logs its own actions
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    try:
        cfg = Config.from_dict(json.loads(args.config.read_text()))
    except (OSError, ValueError) as exc:
        print(f"--config {args.config}: {exc}", file=sys.stderr)
        return 2
    conf = client.Configuration()
    if args.kubeconfig:
        config.load_kube_config(config_file=args.kubeconfig, client_configuration=conf)
    else:
        try:
            config.load_incluster_config(client_configuration=conf)
        except config.ConfigException:
            config.load_kube_config(client_configuration=conf)
    # one kept-alive connection per handler thread: with the default (5 x CPUs) the pool overflowed, connections
    # were discarded and each further request paid a new TCP + TLS handshake
    conf.connection_pool_maxsize = MAX_WORKERS + 4
    api = client.ApiClient(conf)
    metrics = Metrics()
    if args.metrics_port:
        metrics.serve(args.metrics_port, args.metrics_address)
    elector = None
    if args.leader_elect:
        ns, _sep, lease = args.leader_elect.partition("/")
        if not ns or not lease:
            print(f"--leader-elect {args.leader_elect!r}: expected NAMESPACE/NAME", file=sys.stderr)
            return 2
        elector = LeaderElector(api, ns, lease, args.identity, lease_s=args.lease_seconds,
                                renew_s=max(1.0, args.lease_seconds / 3))
        logging.getLogger("zjusct_controller").info(
            "leader election: %s waiting for lease %s", args.identity, args.leader_elect)
        elector.acquire()
        # Lost the Lease: stop reconciling at once (exit; a Pod restarts as a candidate).
        elector.hold(on_lost=lambda: os._exit(1))
    install(Reconciler(api, cfg, metrics, tuple(args.namespace)), args.resync)

    @kopf.on.login()
    def _login(**kwargs: object) -> kopf.ConnectionInfo | None:
        if args.kubeconfig:
            return kopf.login_with_kubeconfig(**kwargs)  # type: ignore[arg-type]
        return kopf.login_via_client(**kwargs)  # type: ignore[arg-type]

    if args.kubeconfig:
        os.environ["KUBECONFIG"] = args.kubeconfig
    try:
        if args.namespace:
            kopf.run(standalone=True, namespaces=args.namespace)
        else:
            kopf.run(standalone=True, clusterwide=True)
    finally:
        if elector is not None:
            elector.stop(release=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
