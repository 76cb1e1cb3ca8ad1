"""The Kafka log format: record batches (`records`), segment files and their indexes
(`segment`, `index`), checkpoints, the local log reader and writer, and `tiered log dump`.

Depends on nothing of tiered's but `tiered.errors` and `tiered.topics`; everything above it
(stores aside) reads and writes Kafka data through it."""
