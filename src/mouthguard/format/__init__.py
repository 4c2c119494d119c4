"""The checkpoint on-disk format: manifests, rank files and typed JSON state."""
