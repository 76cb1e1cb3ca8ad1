"""The remote-read cache: chunk files on disk, size and object accounting, trimming and chunk
eviction strategies (issue 5)."""
