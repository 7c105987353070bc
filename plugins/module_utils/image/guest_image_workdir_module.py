# -*- coding: utf-8 -*-
# Copyright: zjusct.cloud contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The body of ``zjusct.cloud.guest_image_workdir``: a build tree removed safely, or emptied
(:mod:`image.fs`)."""

from __future__ import annotations

import os

from ansible_collections.zjusct.cloud.plugins.module_utils.common.errors import CloudError
from ansible_collections.zjusct.cloud.plugins.module_utils.image.fs import mounts_below, remove_tree


def run_guest_image_workdir(params: dict, check_mode: bool) -> dict:
    """The ``zjusct.cloud.guest_image_workdir`` module: remove the tree at ``path`` (unmounting what is mounted
    below it, never crossing into another filesystem); ``state: empty`` then recreates it (mode 0700) with
    ``subdirs`` (0755).

    Returns:
        ``{"changed", "removed", "unmounted"}`` (in check mode: what would be removed and unmounted).

    Raises:
        CloudError: ``path`` not absolute or ``/``, or a removal / unmount / mkdir failed (``field: path``).
    """
    path, state = params["path"], params["state"]
    if not os.path.isabs(path) or os.path.realpath(path) == "/":
        raise CloudError(f"path: {path!r} must be an absolute path other than /", field="path")
    exists = os.path.lexists(path)
    if check_mode:
        return {"changed": exists or state == "empty", "removed": exists, "unmounted": mounts_below(path)}
    try:
        unmounted = mounts_below(path)
        removed = remove_tree(path)
        if state == "empty":
            os.makedirs(path, mode=0o700)
            for sub in params["subdirs"]:
                os.makedirs(os.path.join(path, sub), mode=0o755, exist_ok=True)
    except OSError as exc:  # FsError included
        raise CloudError(f"path: {path}: {exc}", field="path") from exc
    return {"changed": removed or state == "empty", "removed": removed, "unmounted": unmounted}
