"""Stand-in for pip's get-pip.py bootstrap script, used by ansible-test to put pip into its sanity venvs.

ansible-test downloads get-pip.py from a host these machines cannot reach and caches it under
~/.ansible/test/cache/get_pip_<version>.py; hack/sanity.sh installs this file there instead. It takes
the same arguments (pip install options and the pinned packages), bootstraps pip from the wheel bundled
with Python (ensurepip, no network), then lets that pip install the pinned versions from PyPI.
"""

import ensurepip
import os
import runpy
import sys

saved = dict(os.environ)
ensurepip.bootstrap(upgrade=True)
# ensurepip hides pip's configuration (PIP_CONFIG_FILE=/dev/null, PIP_* removed); the real install
# needs it back (e.g. the site's CA bundle in /etc/pip.conf).
os.environ.clear()
os.environ.update(saved)
args = [a for a in sys.argv[1:] if a not in ("--no-setuptools", "--no-wheel")]
sys.argv = ["pip", "install", *args]
runpy.run_module("pip", run_name="__main__", alter_sys=True)
