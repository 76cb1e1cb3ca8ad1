"""Loading and validating tiered's one TOML configuration file into `tiered.config.model`.

Validation collects every problem before it reports, so one `tiered config check` run shows all
of them; each problem names the file, the section and the key. Relative paths resolve against the
file's directory. Documented in docs/configuration.md.
"""

from __future__ import annotations

import difflib
import hashlib
import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from tiered.config.http import parse_http
from tiered.config.kafka import parse_kafka
from tiered.config.model import (
    _STORAGE_ALTERNATIVES,
    LOG_RETENTION_MODES,
    SECTION_KEYS,
    Config,
    FrozenMap,
    StorageConfig,
    check_topic_name,
)
from tiered.config.properties import (
    CLUSTER,
    Secret,
    Value,
    cluster_rule_problems,
    lookup,
    parse_table,
)
from tiered.config.units import describe
from tiered.errors import ConfigError, TieredError
from tiered.topics import node_id_problem

# --- parsing ----------------------------------------------------------------------------------


class _Problems:
    """Collects problems, each prefixed with the file and the place in it."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.items: list[str] = []

    def add(self, where: str, message: str) -> None:
        self.items.append(f"{self.source}: {where}: {message}")


def _quote_topic(name: str) -> str:
    escaped = name.replace("\\", "\\\\").replace('"', '\\"')
    return f'[topics."{escaped}"]'


def _section(data: Mapping[str, Any], name: str, problems: _Problems) -> dict[str, Any]:
    table = data.get(name, {})
    if not isinstance(table, dict):
        problems.add(f"[{name}]", f"must be a table (a [{name}] section), got {describe(table)}")
        return {}
    for key in table:
        if name in ("storage", "log", "cache", "node") and key not in SECTION_KEYS[name]:
            problems.add(f"[{name}] {key}", _unknown_section_key(name, key))
    return table


def _unknown_section_key(section: str, key: str) -> str:
    if lookup("cluster", key):
        return "unknown key; cluster properties go under [cluster]"
    close = suggest_from(key, SECTION_KEYS[section])
    allowed = ", ".join(SECTION_KEYS[section])
    return f"unknown key (did you mean {close}?)" if close else f"unknown key; expected {allowed}"


def suggest_from(key: str, candidates: tuple[str, ...] | list[str]) -> str | None:
    """The closest of `candidates` to a misspelt `key`, for "did you mean"."""
    close = difflib.get_close_matches(key, list(candidates), n=1, cutoff=0.6)
    return close[0] if close else None


def _string(table: Mapping[str, Any], section: str, key: str, problems: _Problems) -> str | None:
    raw = table.get(key)
    if raw is None:
        return None
    if not isinstance(raw, str) or not raw.strip():
        got = "an empty string" if isinstance(raw, str) else describe(raw)
        if key.endswith("_key") and not isinstance(raw, str):
            got = f"{describe(raw).split()[0]} (value hidden)"  # credentials are never echoed
        problems.add(f"[{section}] {key}", f"expected a non-empty string, got {got}")
        return None
    return raw


def _path(text: str, base_dir: Path) -> Path:
    path = Path(os.path.expanduser(text))
    return Path(os.path.normpath(path if path.is_absolute() else base_dir / path))


def _endpoint_problem(url: str) -> str | None:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"expected an http:// or https:// URL, got {url!r}"
    return None


def _parse_storage(
    table: Mapping[str, Any], cluster: Mapping[str, Value], problems: _Problems
) -> StorageConfig:
    url = _string(table, "storage", "url", problems)
    if url is None and "url" not in table:
        problems.add(
            "[storage] url", "required: the bucket, e.g. 's3://bucket/prefix' or 'file:///path'"
        )
    elif url is not None:
        from tiered.store import parse_store_url  # lazily: ~30 ms of imports, for a URL only

        try:
            parse_store_url(url)
        except (TieredError, ValueError) as exc:
            problems.add("[storage] url", str(exc))
    values: dict[str, str | None] = {}
    for key, alternative in _STORAGE_ALTERNATIVES.items():
        mine = _string(table, "storage", key, problems)
        theirs = cluster[alternative]
        if isinstance(theirs, str) and key == "endpoint_url" and "://" not in theirs:
            scheme = "http" if cluster["cloud_storage_disable_tls"] else "https"
            theirs = f"{scheme}://{theirs}:{cluster['cloud_storage_api_endpoint_port']}"
        if mine is not None and theirs is not None and str(mine) != str(theirs):
            problems.add(f"[storage] {key}", f"conflicts with [cluster] {alternative}; set one")
        values[key] = mine if mine is not None else (str(theirs) if theirs is not None else None)
    endpoint = values["endpoint_url"]
    if endpoint is not None and (problem := _endpoint_problem(endpoint)) is not None:
        came_from = (
            "[storage] endpoint_url"
            if "endpoint_url" in table
            else ("[cluster] cloud_storage_api_endpoint")
        )
        problems.add(came_from, problem)
    access, secret = values["access_key"], values["secret_key"]
    if (access is None) != (secret is None):
        missing = "secret_key" if secret is None else "access_key"
        problems.add(
            f"[storage] {missing}",
            "required with the other half of the key pair; set both, or neither to use the "
            "standard AWS credential chain",
        )
    return StorageConfig(
        url=url or "",
        endpoint_url=endpoint,
        region=values["region"],
        access_key=Secret(access) if access is not None else None,
        secret_key=Secret(secret) if secret is not None else None,
    )


def _parse_log_dirs(table: Mapping[str, Any], base: Path, problems: _Problems,
                    check_dirs: bool = False) -> tuple[Path, ...]:
    raw = table.get("dirs", [])
    if isinstance(raw, str):  # Kafka's log.dirs is one comma-separated string
        raw = [part.strip() for part in raw.split(",")]
    if not isinstance(raw, list) or not all(isinstance(d, str) and d.strip() for d in raw):
        problems.add("[log] dirs", f"expected a list of directory paths, got {describe(raw)}")
        return ()
    dirs = [_path(d, base) for d in raw]
    for i, path in enumerate(dirs):
        if path in dirs[:i]:
            problems.add("[log] dirs", f"{str(path)!r} is listed twice")
        elif check_dirs and not path.is_dir():
            problems.add("[log] dirs", f"{path} does not exist or is not a directory")
    return tuple(dict.fromkeys(dirs))


def _default_cache_dir(url: str) -> Path:
    """$XDG_CACHE_HOME/tiered/<hash of the bucket URL>: per bucket, because cached chunks are
    keyed by object key and two buckets may hold the same keys."""
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(root) / "tiered" / hashlib.sha256(url.encode()).hexdigest()[:16]


def parse_config(data: Mapping[str, Any], *, source: str, base_dir: Path | None = None,
                 check_dirs: bool = False) -> Config:
    """Validate parsed TOML `data` (from file `source`, named in every problem) into a Config.

    Relative paths resolve against `base_dir` (default: the working directory). `check_dirs`:
    also require every `[log] dirs` entry to exist here, among the other problems, so one
    check reports them all. Raises one ConfigError listing every problem found."""
    problems = _Problems(source)
    base = (base_dir or Path.cwd()).absolute()
    for key, value in data.items():
        if key in SECTION_KEYS:
            continue
        if isinstance(value, dict):
            close = suggest_from(key, list(SECTION_KEYS))
            hint = f" (did you mean [{close}]?)" if close else ""
            problems.add(
                f"[{key}]",
                f"unknown section{hint}; sections: " + ", ".join(f"[{s}]" for s in SECTION_KEYS),
            )
            continue
        home = next((s for s, keys in SECTION_KEYS.items() if key in keys), None)
        if home is None and lookup("cluster", key):
            home = "cluster"
        hint = f" (did you mean [{home}] {key}?)" if home else ""
        problems.add(key, f"unknown top-level key; settings belong in a section{hint}")

    parsed = parse_table("cluster", _section(data, "cluster", problems))
    cluster: dict[str, Value] = {p.name: p.default for p in CLUSTER} | parsed.values
    for key, message in parsed.problems + cluster_rule_problems(cluster, parsed.failed):
        problems.add(f"[cluster] {key}", message)

    storage = _parse_storage(_section(data, "storage", problems), cluster, problems)

    log_table = _section(data, "log", problems)
    log_dirs = _parse_log_dirs(log_table, base, problems, check_dirs)
    mode = log_table.get("retention", "advise")
    if not isinstance(mode, str) or mode not in LOG_RETENTION_MODES:
        problems.add("[log] retention", f"expected 'enforce' or 'advise', got {describe(mode)}")

    history_server = "dirs" in log_table and log_dirs == ()

    kafka = parse_kafka(data.get("kafka"), base, problems.add)
    http = parse_http(data.get("http"), base, problems.add)

    cache_dir_text = _string(_section(data, "cache", problems), "cache", "dir", problems)
    cache_dir = _path(cache_dir_text, base) if cache_dir_text else _default_cache_dir(storage.url)

    node = _string(_section(data, "node", problems), "node", "id", problems)
    if node is not None and (problem := node_id_problem(node)) is not None:
        problems.add("[node] id", problem)

    topics: dict[str, FrozenMap[str, Value]] = {}
    topics_table = _section(data, "topics", problems)
    for name, table in topics_table.items():
        where = _quote_topic(name)
        if (problem := check_topic_name(name)) is not None:
            problems.add(where, problem)
        if not isinstance(table, dict):
            problems.add(where, f"expected a table of topic properties, got {describe(table)}")
            continue
        parsed = parse_table("topic", table)
        for key, message in parsed.problems:
            problems.add(f"{where} {key}", message)
        topics[name] = FrozenMap(parsed.values)

    if problems.items:
        count = len(problems.items)
        message = (
            problems.items[0]
            if count == 1
            else (f"{source}: {count} configuration problems:\n  " + "\n  ".join(problems.items))
        )
        raise ConfigError(message, problems.items)
    return Config(
        source=source,
        storage=storage,
        log_dirs=log_dirs,
        log_retention_mode=str(mode),
        cache_dir=cache_dir,
        cluster=FrozenMap(cluster),
        topics=FrozenMap(topics),
        node=node,
        kafka=kafka,
        history_server=history_server,
        http=http,
    )


def load_config(path: str | os.PathLike[str], *, check_dirs: bool = False) -> Config:
    """Read, parse and validate the TOML file at `path`; ConfigError names every problem
    (`check_dirs`: as `parse_config`'s)."""
    source = str(path)
    file = Path(path)
    try:
        raw = file.read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"{source}: no such file") from None
    except IsADirectoryError:
        raise ConfigError(f"{source}: is a directory, not a configuration file") from None
    except OSError as exc:
        raise ConfigError(f"{source}: cannot read: {exc.strerror or exc}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"{source}: not a TOML file: byte {exc.start} is not UTF-8 text"
        ) from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{source}: invalid TOML: {exc}") from None
    return parse_config(data, source=source, base_dir=file.absolute().parent,
                        check_dirs=check_dirs)


def check_config(
    path: str | os.PathLike[str], *, check_dirs: bool = True
) -> tuple[dict[str, Any] | None, list[str]]:
    """For `tiered config check`: (effective config with secrets masked, []) when the file is
    valid, else (None, every problem). `check_dirs`: also require every `[log] dirs` entry to
    exist here, as the commands that read the log do (off to check a file meant for another
    host, such as a container's)."""
    try:
        # the commands that read the log refuse a missing dir; the check says so too, beside
        # every other problem rather than after they are fixed
        config = load_config(path, check_dirs=check_dirs)
    except ConfigError as exc:
        return None, list(exc.problems)
    return config.effective(mask_secrets=True), []


def default_config(base_dir: Path) -> Config:
    """The embedded configuration `tiered demo` runs with: a `file://` bucket in
    base_dir/bucket, the log in base_dir/log, the cache in base_dir/cache. Local retention is
    enforced, since the demo owns its log directory."""
    base = Path(base_dir).absolute()
    data = {
        "storage": {"url": (base / "bucket").as_uri()},
        "log": {"dirs": [str(base / "log")], "retention": "enforce"},
        "cache": {"dir": str(base / "cache")},
    }
    return parse_config(data, source="<default config>", base_dir=base)


