"""host.store._sigterm_raises: SIGTERM raises Interrupted in the run that installed it, and ends at once a process
forked from it without exec (a library's helper child must not run on in its copy of the run's stack)."""

from __future__ import annotations

import os
import signal
import time

import pytest
from ansible_collections.zjusct.cloud.plugins.module_utils.host import store


def test_sigterm_in_the_run_raises_interrupted():
    with pytest.raises(store.Interrupted):
        with store._sigterm_raises():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)


def test_a_forked_child_ends_on_sigterm_instead_of_raising_into_the_run():
    read, write = os.pipe()
    with store._sigterm_raises():
        pid = os.fork()
        if pid == 0:  # the child: tell the parent it waits, then wait for the signal
            os.close(read)
            try:
                os.write(write, b"r")
                time.sleep(30)
            except BaseException:
                os._exit(3)  # the handler raised into the child's copy of the stack
            os._exit(4)
        os.close(write)
        assert os.read(read, 1) == b"r"
        os.close(read)
        os.kill(pid, signal.SIGTERM)
        _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 128 + signal.SIGTERM
