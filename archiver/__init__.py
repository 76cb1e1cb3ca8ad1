"""The write path: per-partition archiver, upload policy, PD backlog controller, remote retention,
garbage collection, and the local-retention gate and space management."""
