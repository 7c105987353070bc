"""network/tc.py is the pure half of the HTB code (tree, diff): importing it loads neither the kernel adapter nor the
libraries the adapter talks to the kernel with (docs/qos.md "What is on the device")."""

from __future__ import annotations

import subprocess
import sys


def test_the_tree_module_loads_no_kernel_adapter():
    code = ("import sys\n"
            "from ansible_collections.zjusct.cloud.plugins.module_utils.network import tc as _tc\n"
            "tree = _tc.desired_tree([_tc.ClassSpec('a', 10, 20, mac='02:00:00:00:00:01', minor=16)], mtu=1500,"
            " root_rate_mbps=100, default_rate_mbps=1, default_ceil_mbps=100, direction='egress', tick_in_usec=1.0)\n"
            "assert _tc.diff_trees(tree, tree) == []\n"
            "loaded = sorted(m for m in sys.modules if m.startswith('pyroute2') or m.endswith('.tc_netlink'))\n"
            "print(loaded)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False,
                         env={"PYTHONPATH": ":".join(p for p in sys.path if p)}, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", out.stdout
