"""zjusct.cloud's Kubernetes controller: CloudVM -> one launcher Pod per boot (docs/controller.md).

The pure decisions (:mod:`.decide`, on :mod:`.config`, :mod:`.pod`, :mod:`.observe`, :mod:`.volume` and
:mod:`.refusal`; docs/architecture.md "controller/zjusct_controller, room by room") reuse the collection's shared
state machine in ``plugins/module_utils`` (:mod:`model.phase`, :mod:`model.spec`, :mod:`model.placement`,
:mod:`model.names`) so the host and the Kubernetes backends derive status the same way. The collection is imported as
``ansible_collections.zjusct.cloud``; in a checkout, ``hack/setup-collection.sh`` links it under
``.collections`` and :mod:`._collection` puts that directory on ``sys.path`` when it is not importable yet.
"""

from . import _collection  # noqa: F401  (side effect: makes ansible_collections.zjusct.cloud importable)

__version__ = "0.1.0"
