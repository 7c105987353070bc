"""Reading ansible-playbook runs of the e2e tests (the ``ansible.posix.json`` callback's document)."""

from __future__ import annotations


def task_result(doc: dict, task_name: str) -> dict:
    """The localhost result of the task named ``task_name``.

    Raises:
        KeyError: no task of that name ran.
    """
    for play in doc["plays"]:
        for task in play["tasks"]:
            if task["task"]["name"] == task_name:
                return task["hosts"]["localhost"]
    raise KeyError(task_name)


def failure(doc: dict) -> str:
    """The messages (``msg``) of the failed tasks of a run, joined by `` | ``.

    Raises:
        AssertionError: no task failed (the run's output tail is in the message).
    """
    msgs = [str(h.get("msg", h)) for p in doc.get("plays", []) for t in p["tasks"]
            for h in t["hosts"].values() if h.get("failed")]
    if not msgs:
        raise AssertionError(f"no failed task: {doc.get('raw', '')[-2000:]} {doc.get('stderr', '')[-2000:]}")
    return " | ".join(msgs)
