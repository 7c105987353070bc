"""zjusct.cloud launcher: one process runs one boot of one VM."""
