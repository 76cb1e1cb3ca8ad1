"""The principal of a client certificate: its CN, or the first of Kafka-style
`tls_principal_rule`s matching the subject DN (RFC 2253 order, as Kafka matches it)."""

from __future__ import annotations

import pytest

from tiered.app.kafka_api.auth import ConnectionAuth, Guard, NotAuthenticated, tls_principal
from tiered.config.security import KafkaSecurity, parse_principal_rules
from tiered.config.units import UnitError

#: what `SSLSocket.getpeercert()` gives: RDNs in certificate order (most general first)
CERT = {"subject": ((("countryName", "DE"),), (("organizationName", "acme"),),
                    (("organizationalUnitName", "Apps"),), (("commonName", "Alice"),))}


def test_the_cn_by_default() -> None:
    assert tls_principal(CERT, ()) == "User:Alice"
    assert tls_principal({"subject": ((("organizationName", "acme"),),)}, ()) is None
    assert tls_principal(None, ()) is None


def test_rules_match_the_rfc2253_dn_in_order() -> None:
    rules = parse_principal_rules(["RULE:^CN=([^,]+),OU=Ops,.*$/ops-$1/",
                                   "RULE:^CN=([^,]+),OU=Apps,O=acme,C=DE$/$1/L", "DEFAULT"])
    assert tls_principal(CERT, rules) == "User:alice"
    other = {"subject": ((("commonName", "Bob"),),)}
    assert tls_principal(other, rules) == "User:Bob"  # DEFAULT: the CN
    upper = parse_principal_rules("RULE:^CN=([^,]+),.*$/$1/U")
    assert tls_principal(CERT, upper) == "User:ALICE"


@pytest.mark.parametrize("rule", ["CN=.*", "RULE:(/x/", "RULE:^a$/b", ["RULE:x/y/", 3], []])
def test_bad_rules_are_refused(rule: object) -> None:
    with pytest.raises(UnitError):
        parse_principal_rules(rule)


def test_a_session_past_its_lifetime_closes_the_connection() -> None:
    now = [100.0]
    guard = Guard(KafkaSecurity(sasl_mechanisms=("SCRAM-SHA-512",), session_lifetime_ms=5000),
                  view=object(), tls=False, clock=lambda: now[0])  # type: ignore[arg-type]
    auth = ConnectionAuth()
    guard.admit(auth, 18)  # ApiVersions before authenticating
    with pytest.raises(NotAuthenticated):
        guard.admit(auth, 3)
    auth.authenticated, auth.expires_at = True, 105.0
    guard.admit(auth, 3)
    now[0] = 105.0
    with pytest.raises(NotAuthenticated, match="expired"):
        guard.admit(auth, 3)
    guard.admit(auth, 36)  # re-authenticating is still allowed
