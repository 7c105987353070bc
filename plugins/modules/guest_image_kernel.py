#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: zjusct.cloud contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Ansible module zjusct.cloud.guest_image_kernel: the kernel artefacts of a guest image set."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: guest_image_kernel
short_description: Produce vmlinuz, vmlinux and a busybox initrd from the kernel installed in a guest root tree
version_added: "0.1.0"
description:
  - Finds the single kernel installed in the guest root tree O(root) (C(/boot/vmlinuz-<version>) with
    C(/lib/modules/<version>)), copies the bzImage to C(<dest>/vmlinuz), extracts the uncompressed ELF to
    C(<dest>/vmlinux) (gzip, xz, lzma, bzip2 payloads in Python; zstd through the C(zstd) command), and builds
    C(<dest>/initrd.img), a gzip newc cpio with O(busybox), the O(init_script) as C(/init) and the dependency
    closure of O(modules) taken from the tree's C(modules.dep) in load order (built-in modules are skipped).
  - Files whose content is already identical are left alone, so C(changed) is true only when something was
    written.
options:
  root:
    description: The guest root tree (the debootstrap target).
    type: path
    required: true
  dest:
    description: Directory receiving C(vmlinuz), C(vmlinux) and C(initrd.img).
    type: path
    required: true
  busybox:
    description: A statically linked busybox binary on the build host (package busybox-static).
    type: path
    default: /bin/busybox
  init_script:
    description: Text of the initrd's C(/init) (a busybox sh script).
    type: str
    required: true
  modules:
    description: Root kernel modules for the initrd; their dependencies are added from modules.dep.
    type: list
    elements: str
    default: [virtio_pci, virtio_mmio, virtio_blk, virtio_net, virtio_rng, crc32c_generic, ext4, button, evdev]
author: ZJUSCT cloud team (@zjusct)
"""

EXAMPLES = r"""
- name: Kernel artefacts
  zjusct.cloud.guest_image_kernel:
    root: /var/lib/zjusct-cloud/images/.build-debian-bookworm-3f1c0a9b2d4e/root
    dest: /var/lib/zjusct-cloud/images/.build-debian-bookworm-3f1c0a9b2d4e/out
    init_script: "{{ lookup('ansible.builtin.file', 'initrd-init.sh') }}"
"""

RETURN = r"""
kernel_version:
  description: The kernel release (directory name under /lib/modules).
  type: str
  returned: success
  sample: 6.1.0-50-amd64
compression:
  description: Compression of the bzImage payload.
  type: str
  returned: success
  sample: xz
initrd_modules:
  description: Module files in the initrd, in load order (relative to /lib/modules/<version>).
  type: list
  elements: str
  returned: success
written:
  description: Artefacts whose content changed.
  type: list
  elements: str
  returned: success
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.zjusct.cloud.plugins.module_utils.image.guest_image_kernel_module import run_guest_image_kernel
from ansible_collections.zjusct.cloud.plugins.module_utils.common.module import run_module

ARGUMENT_SPEC: dict = dict(
    root=dict(type="path", required=True),
    dest=dict(type="path", required=True),
    busybox=dict(type="path", default="/bin/busybox"),
    init_script=dict(type="str", required=True),
    modules=dict(type="list", elements="str", default=[
        "virtio_pci", "virtio_mmio", "virtio_blk", "virtio_net", "virtio_rng", "crc32c_generic", "ext4",
        "button", "evdev"]),
)


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=False)
    run_module(module, run_guest_image_kernel)


if __name__ == "__main__":
    main()
