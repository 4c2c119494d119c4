"""A real S3 server for tests: a throwaway Ceph RADOS Gateway on 127.0.0.1, or a given endpoint."""
