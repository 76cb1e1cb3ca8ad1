"""The users and ACLs every request is checked against: the bucket's set, read again every
`REFRESH_S` seconds, so an ACL added or a user deleted through any sidecar (or `tiered acl`)
is enforced by every sidecar on the bucket within that delay, without a restart
(docs/security.md, "How fast a change applies").

A refresh that fails (the bucket unreachable, a damaged object) keeps the last set read and
logs it; before any read succeeded the set is empty, so nothing is allowed that needs an ACL.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field

from manifests.security import Acl, Operation, User, load_acls, load_users
from tiered.app.authz import Policy, Resource, authorize
from tiered.errors import TieredError
from tiered.store.base import ObjectStore

__all__ = ["REFRESH_S", "SecurityView", "Snapshot"]

log = logging.getLogger("tiered.app.security")

#: seconds between two reads of the bucket's users and ACLs: the longest a change takes to
#: be enforced everywhere (plus one read's time)
REFRESH_S = 5.0


@dataclass(frozen=True)
class Snapshot:
    users: Mapping[str, User] = field(default_factory=dict)
    acls: tuple[Acl, ...] = ()


class SecurityView:
    """Thread-safe: readers take the current immutable `Snapshot`; one thread replaces it."""

    def __init__(self, store: ObjectStore, policy: Policy, *, refresh_s: float = REFRESH_S
                 ) -> None:
        self.store = store
        self.policy = policy
        self.refresh_s = refresh_s
        self.snapshot = Snapshot()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failing = False

    def refresh(self) -> bool:
        """Read the bucket's set now; False (logged, the last set kept) when it cannot."""
        try:
            users, _ = load_users(self.store)
            acls, _ = load_acls(self.store)
        except TieredError as exc:
            if not self._failing:
                log.warning("security: cannot read users and ACLs from the bucket (%s); "
                            "enforcing the last set read until it can", exc)
            self._failing = True
            return False
        if self._failing:
            log.info("security: users and ACLs read from the bucket again")
        self._failing = False
        self.snapshot = Snapshot(users, acls)
        return True

    def start(self) -> None:
        self.refresh()
        self._thread = threading.Thread(target=self._loop, name="tiered-security",
                                        daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _loop(self) -> None:
        while not self._stop.wait(self.refresh_s):
            self.refresh()

    def user(self, name: str) -> User | None:
        return self.snapshot.users.get(name)

    def authorize(self, principal: str, host: str, operation: Operation,
                  resource: Resource) -> bool:
        return authorize(self.snapshot.acls, self.policy, principal, host, operation, resource)
