"""zjusct.cloud launcher: one process runs one boot of one VM.

Protocol: ``launcher.cloud.zjusct.io/v1`` (docs/launcher-protocol.md). Standard library only; Python >= 3.9.
"""

__version__ = "1.4.0"
API_VERSION = "launcher.cloud.zjusct.io/v1"
PROTOCOL_VERSIONS = (API_VERSION,)
