"""Configuration: the typed model (`model`), the TOML loader (`loader`), the property
registry (`properties`) and units (`units`). The names most code needs are re-exported here."""

from tiered.config.loader import check_config, default_config, load_config, parse_config
from tiered.config.model import (
    LOG_RETENTION_MODES,
    Config,
    StorageConfig,
    TopicConfig,
    check_topic_name,
)

__all__ = [
    "LOG_RETENTION_MODES",
    "Config",
    "StorageConfig",
    "TopicConfig",
    "check_config",
    "check_topic_name",
    "default_config",
    "load_config",
    "parse_config",
]
