"""librdkafka before 2.6.1 repeats its nonce in SCRAM's client-final message; the endpoint
accepts exactly that form (as Kafka 3.8.1-3.9 did) and refuses any other nonce. The client
side is computed here by hand from RFC 5802, independently of scramp."""

from __future__ import annotations

import base64
import hashlib
import hmac

import pytest
import scramp

from manifests.security import make_credential
from tiered.app.kafka_api.sasl import _accept_librdkafka_nonce


def _final(password: str, first_bare: str, server_first: str, nonce: str) -> str:
    attrs = dict(a.split("=", 1) for a in server_first.split(","))
    salted = hashlib.pbkdf2_hmac("sha512", password.encode(), base64.b64decode(attrs["s"]),
                                 int(attrs["i"]))
    client_key = hmac.digest(salted, b"Client Key", "sha512")
    stored = hashlib.sha512(client_key).digest()
    without_proof = f"c=biws,r={nonce}"
    auth = f"{first_bare},{server_first},{without_proof}".encode()
    signature = hmac.digest(stored, auth, "sha512")
    proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
    return f"{without_proof},p={base64.b64encode(proof).decode()}"


def _exchange(nonce_of: str) -> None:
    c = make_credential("pw", "SCRAM-SHA-512")
    server = scramp.ScramMechanism("SCRAM-SHA-512").make_server(
        lambda _u: (c.salt, c.stored_key, c.server_key, c.iterations))
    first_bare = "n=alice,r=clientnonce"
    server.set_client_first("n,," + first_bare)
    server_first = server.get_server_first()
    full = server_first.split(",")[0][2:]
    nonce = {"rfc": full, "librdkafka": "clientnonce" + full,
             "other": "clientnonceX" + full}[nonce_of]
    final = _final("pw", first_bare, server_first, nonce)
    _accept_librdkafka_nonce(server, final)
    server.set_client_final(final)
    server.get_server_final()


@pytest.mark.parametrize("form", ["rfc", "librdkafka"])
def test_the_rfc_and_librdkafka_forms_authenticate(form: str) -> None:
    _exchange(form)


def test_any_other_nonce_is_refused() -> None:
    with pytest.raises(scramp.ScramException, match="nonce"):
        _exchange("other")
