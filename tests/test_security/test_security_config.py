"""The security keys of [kafka] and the [http] section: defaults that change nothing, the
contract's names, PLAIN refused without TLS unless allowed, mutual TLS only over TLS, principal
rules, and every problem named by its key."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tiered.config import parse_config
from tiered.config.http import HttpConfig
from tiered.config.security import KafkaSecurity
from tiered.errors import ConfigError

TLS = {"tls_cert": "c.pem", "tls_key": "k.pem"}


def _config(tmp_path: Path, kafka: Any = None, http: Any = None) -> Any:
    data: dict[str, Any] = {"storage": {"url": (tmp_path / "b").as_uri()}}
    if kafka is not None:
        data["kafka"] = {"listen": "9092", **kafka}
    if http is not None:
        data["http"] = http
    return parse_config(data, source="t.toml", base_dir=tmp_path)


def _problems(tmp_path: Path, **kw: Any) -> list[str]:
    with pytest.raises(ConfigError) as err:
        _config(tmp_path, **kw)
    return err.value.problems


def test_defaults_change_nothing(tmp_path: Path) -> None:
    config = _config(tmp_path, {})
    assert config.kafka.security == KafkaSecurity()
    assert not config.kafka.security.authenticates
    assert config.http == HttpConfig() and config.effective()["http"]["auth"] == "none"


def test_every_key(tmp_path: Path) -> None:
    config = _config(tmp_path, {
        **TLS, "sasl_mechanisms": ["SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN"],
        "tls_client_ca": "ca.pem", "tls_principal_rule": "RULE:^CN=([^,]+),OU=apps.*$/$1/L",
        "allow_everyone_if_no_acl": True, "super_users": ["User:admin"],
        "session_lifetime_ms": "1h"}, {"auth": "basic", **TLS, "tls_client_ca": "ca.pem"})
    s = config.kafka.security
    assert s.sasl_mechanisms == ("SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN")
    assert s.tls_client_ca == tmp_path / "ca.pem" and s.authenticates
    assert s.allow_everyone_if_no_acl and s.super_users == ("User:admin",)
    assert s.session_lifetime_ms == 3_600_000 and not s.allow_plaintext_sasl
    rule = s.tls_principal_rules[0]
    assert rule.pattern is not None and rule.case == "L"
    assert config.http == HttpConfig(auth="basic", tls_cert=tmp_path / "c.pem",
                                     tls_key=tmp_path / "k.pem",
                                     tls_client_ca=tmp_path / "ca.pem")
    effective = config.effective()
    assert effective["kafka"]["sasl_mechanisms"] == list(s.sasl_mechanisms)
    assert effective["http"]["auth"] == "basic"


def test_plain_without_tls_needs_allow_plaintext_sasl(tmp_path: Path) -> None:
    problems = _problems(tmp_path, kafka={"sasl_mechanisms": ["PLAIN"]})
    assert any("[kafka] allow_plaintext_sasl" in p for p in problems)
    allowed = _config(tmp_path, {"sasl_mechanisms": ["PLAIN"], "allow_plaintext_sasl": True})
    assert allowed.kafka.security.sasl_mechanisms == ("PLAIN",)
    assert _config(tmp_path, {**TLS, "sasl_mechanisms": ["PLAIN"]}).kafka.security


@pytest.mark.parametrize(("kafka", "http", "key"), [
    ({"sasl_mechanisms": ["GSSAPI"]}, None, "[kafka] sasl_mechanisms"),
    ({"sasl_mechanisms": "SCRAM-SHA-512"}, None, "[kafka] sasl_mechanisms"),
    ({"tls_client_ca": "ca.pem"}, None, "[kafka] tls_client_ca"),
    ({**TLS, "tls_principal_rule": "CN=.*"}, None, "[kafka] tls_principal_rule"),
    ({"super_users": ["admin"]}, None, "[kafka] super_users"),
    ({"allow_everyone_if_no_acl": "yes"}, None, "[kafka] allow_everyone_if_no_acl"),
    ({"session_lifetime_ms": "soon"}, None, "[kafka] session_lifetime_ms"),
    (None, {"auth": "digest"}, "[http] auth"),
    (None, {"auth": "basic"}, "[http] auth"),
    (None, {"tls_cert": "c.pem"}, "[http] tls_key"),
    (None, {"tls_client_ca": "ca.pem"}, "[http] tls_client_ca"),
    (None, {"realm": "x"}, "[http] realm"),
])
def test_problems_name_the_key(tmp_path: Path, kafka: Any, http: Any, key: str) -> None:
    problems = _problems(tmp_path, kafka=kafka, http=http)
    assert any(key in p for p in problems), problems
