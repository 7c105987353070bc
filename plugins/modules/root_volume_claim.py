#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: (c) 2026, ZJUSCT cloud team
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: root_volume_claim
short_description: Ensure a CloudVM's RBD root volume on Kubernetes (RBD clone, PersistentVolume, bound claim)
version_added: 0.1.0
author: ZJUSCT cloud team (@zjusct)
description:
  - Makes the root volume claim a CloudVM's C(spec.rootVolumeClaim) names exist on the Kubernetes backend, creating
    what is missing, in this order, as the controller expects it (docs/controller.md, Root disk).
  - The RBD image O(pool)/O(rbd_image), a copy-on-write clone of the image set's template
    C(<pool>/tmpl-<image set>@base) (imported once from the set's C(rootfs.raw), protected; shared with the host
    backend's RBD driver) with the owner mark C(cloud.zjusct.io/owner) in its image-meta, grown to O(size_mib).
  - The PersistentVolume O(volume_name) naming the image the way Ceph-CSI does (C(spec.csi.driver)
    C(rbd.csi.ceph.com), C(volumeHandle) C(<pool>/<image>), C(volumeAttributes) C({pool, imageName})), C(volumeMode
    Block), C(Retain), no storage class, pre-bound by C(spec.claimRef) to the claim, labelled
    C(cloud.zjusct.io/owner).
  - The PersistentVolumeClaim O(namespace)/O(name) (C(volumeMode Block), C(spec.volumeName) the PV), labelled
    C(cloud.zjusct.io/owner); the task then waits until it is Bound.
  - The controller's claim mark (annotation C(cloud.zjusct.io/claimed-by)) holding the uid of a CloudVM that no
    longer exists is removed (compare-and-swap on the claim's resourceVersion), so a new CloudVM of the owner can
    use the kept volume; the mark of a CloudVM that exists is left alone (returned as C(claim.used_by)).
  - Refuses, before creating anything, when the image, the PV or the claim exists with another (or no) owner mark,
    the PV is bound to another claim or names another image, or the claim is bound to another PV; the message names
    the object and the field. An object this task created is removed again when a later step fails.
  - Idempotent (a second run changes nothing); check mode creates nothing (the PV and the claim go to the API server
    as dry runs when the image exists); diff mode shows the objects before and after.
  - Ceph credentials come from the C(ceph_*) options or their environment fallbacks; the keyring is never read or
    printed. Kubernetes connection options and their C(K8S_AUTH_*) fallbacks are kubernetes.core's.
extends_documentation_fragment:
  - zjusct.cloud.ceph
  - kubernetes.core.k8s_auth_options
options:
  name:
    description:
      - Name of the PersistentVolumeClaim (the CloudVM's C(spec.rootVolumeClaim)).
      - Exactly one of O(name) and O(vm).
    type: str
  vm:
    description:
      - Name of the CloudVM (a DNS label) whose default root volume claim this is, C(<vm>-root) (the claim the
        M(zjusct.cloud.cloudvm) module gives a new CloudVM, docs/playbooks.md).
      - Exactly one of O(name) and O(vm).
    type: str
  namespace:
    description: Namespace of the claim (the CloudVM's).
    type: str
    default: default
  owner:
    description: Owner of the volume (a DNS label); set as the owner mark on new objects and required on existing ones.
    type: str
    required: true
  pool:
    description: RBD pool of the image (and of the image set's template).
    type: str
    default: rbd
  rbd_image:
    description:
      - RBD image name. Defaults to C(<namespace>.<name>) fitted to 128 characters (docs/naming.md).
    type: str
  volume_name:
    description: PersistentVolume name. Defaults to the RBD image name.
    type: str
  image:
    description:
      - Image set to clone when the RBD image does not exist, a name (newest build wins), a C(name-version)
        directory name under O(images_dir), or an absolute path. Without it a missing image is refused.
    type: str
  images_dir:
    description: Where image sets live on the managed node (C(<images_dir>/<name>-<version>/manifest.json)).
    type: path
    default: /var/lib/zjusct-cloud/images
  size_mib:
    description: Grow a new image to this many MiB (not below the image set's); an existing image keeps its size.
    type: int
  wait:
    description: Wait until the claim is Bound.
    type: bool
    default: true
  wait_timeout:
    description: Seconds to wait for Bound.
    type: int
    default: 120
"""

EXAMPLES = r"""
- name: The root volume of alice's VM web (clone of debian-bookworm, PV, claim web-root)
  zjusct.cloud.root_volume_claim:
    vm: web
    namespace: alice
    owner: alice
    image: debian-bookworm
  environment:
    CEPH_CONF: /etc/ceph/ceph.conf
    CEPH_USER: cloud
    CEPH_KEYRING: /etc/ceph/ceph.client.cloud.keyring
    K8S_AUTH_KUBECONFIG: /etc/zjusct-cloud/kubeconfig

- name: A claim for an image restored from a backup (the image exists, marked alice)
  zjusct.cloud.root_volume_claim:
    name: web-restored-root
    namespace: alice
    owner: alice
    rbd_image: alice.web-restored-root
"""

RETURN = r"""
actions:
  description: The changes made (in check mode, planned), in order.
  returned: always
  type: list
  elements: str
  sample: ["clone rbd/tmpl-debian-bookworm-1@base rbd/alice.web-root", "set image-meta cloud.zjusct.io/owner alice",
           "create PersistentVolume alice.web-root", "create PersistentVolumeClaim alice/web-root"]
rbd_image:
  description: The RBD image (C(size_mib) null when it would be created in check mode).
  returned: success
  type: dict
  sample: {pool: rbd, name: alice.web-root, size_mib: 2048, owner: alice}
persistent_volume:
  description: Name of the PersistentVolume.
  returned: success
  type: str
  sample: alice.web-root
claim:
  description: The claim (C(phase) its C(status.phase), null when it does not exist yet; C(used_by) the CloudVM
    C(namespace/name) whose uid its claim mark holds, else null).
  returned: success
  type: dict
  sample: {namespace: alice, name: web-root, phase: Bound, used_by: alice/web}
diff:
  description: Before/after summary (image owner and size, PV exists, claim phase and claim mark) for C(--diff).
  returned: always
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.zjusct.cloud.plugins.module_utils.k8s.client import auth_argument_spec
from ansible_collections.zjusct.cloud.plugins.module_utils.common.module import run_module
from ansible_collections.zjusct.cloud.plugins.module_utils.storage.rbd import connection_argument_spec
from ansible_collections.zjusct.cloud.plugins.module_utils.k8s.root_volume_claim_module import run_root_volume_claim

ARGUMENT_SPEC: dict = dict(
    name=dict(type="str"),
    vm=dict(type="str"),
    namespace=dict(type="str", default="default"),
    owner=dict(type="str", required=True),
    pool=dict(type="str", default="rbd"),
    rbd_image=dict(type="str"),
    volume_name=dict(type="str"),
    image=dict(type="str"),
    images_dir=dict(type="path", default="/var/lib/zjusct-cloud/images"),
    size_mib=dict(type="int"),
    wait=dict(type="bool", default=True),
    wait_timeout=dict(type="int", default=120),
    **connection_argument_spec(),
    **auth_argument_spec(),  # kubernetes.core's connection options
)


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True,
                           mutually_exclusive=[("name", "vm")], required_one_of=[("name", "vm")])
    run_module(module, run_root_volume_claim)


if __name__ == "__main__":
    main()
