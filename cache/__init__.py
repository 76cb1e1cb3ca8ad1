"""The remote-read cache: chunk files on disk, size and object accounting, trimming and chunk
eviction strategies.

    chunks       chunk layout of a segment on batch boundaries; which chunks a range needs
    chunk_cache  ChunkCache / SegmentHandle: the façade over the pieces below
    state        the lock and the entry table the pieces share
    space        reserving room, trimming, releasing after reads, the periodic check
    hydration    one chunk: single-flight download, verification, opening it stored
    streams      read-ahead: one streamed request per segment, early requests
    write_behind streamed chunks kept in memory and written to their files behind
    chunk_reads  one read: its chunks in turn, then the reader's holds and read-ahead
    download     one chunk's fetch, verification and bounded re-fetch
    accounting   CacheSettings from the cluster properties, limits, the trim plan
    eviction     eager / capped / predictive / lru, registered by name in STRATEGIES
    readers      per-reader holds, sequential detection, registered future needs
    entries      what the cache keeps per segment and per cached file
    mapped       a chunk file opened and mapped once, shared by the fetches that read it
    disk         on-disk layout, atomic writes, the restart index
"""
