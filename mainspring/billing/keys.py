"""API keys: `ms-<project>-<random>`, shown once, stored only as a SHA-256 hash.

A plain (unsalted) SHA-256 is enough here because the secret is ~238 random bits, not a password:
nothing can be guessed from the hash. Lookup goes by the non-secret display prefix, then the hashes
are compared with `hmac.compare_digest` so the time taken does not depend on how much matched.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import string
from dataclasses import dataclass
from datetime import datetime, timezone

from sqlalchemy import select
from sqlalchemy.orm import Session

from mainspring.store.tables import ApiKey, Project

PROJECT_RE = re.compile(r"^[a-z0-9][a-z0-9_]{0,63}$")  # no "-": it separates the parts of a key
_ALPHABET = string.ascii_letters + string.digits
RANDOM_LEN = 40  # 40 chars of 62 = ~238 bits
PREFIX_RANDOM = 8  # random chars kept in the display prefix (also the lookup key)


class KeyAdminError(ValueError):
    """Bad input to key management (bad project name, unknown key id)."""


@dataclass(frozen=True)
class CreatedKey:
    key: ApiKey
    secret: str  # the only time the full secret exists outside the client


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


def _prefix(secret: str) -> str:
    head, _, rand = secret.rpartition("-")
    return f"{head}-{rand[:PREFIX_RANDOM]}"


def get_or_create_project(session: Session, name: str) -> Project:
    if not PROJECT_RE.match(name):
        raise KeyAdminError(f"project name {name!r} must be 1-64 characters of a-z, 0-9 and _, starting with a letter "
                        "or digit")
    p = session.scalar(select(Project).where(Project.name == name))
    if p is None:
        p = Project(name=name)
        session.add(p)
        session.flush()
    return p


def create_key(session: Session, project: str, name: str = "", *, rpm_limit: int | None = None,
               tpm_limit: int | None = None) -> CreatedKey:
    """Make a key for `project` (created if new). Returns the secret once; only its hash is stored."""
    for label, v in (("rpm", rpm_limit), ("tpm", tpm_limit)):
        if v is not None and v < 0:
            raise KeyAdminError(f"{label} limit must be >= 0 (0 = unlimited)")
    proj = get_or_create_project(session, project)
    secret = f"ms-{proj.name}-" + "".join(secrets.choice(_ALPHABET) for _ in range(RANDOM_LEN))
    key = ApiKey(id=f"key_{secrets.token_hex(8)}", project_id=proj.id, name=name, prefix=_prefix(secret),
                 hashed_secret=hash_secret(secret), rpm_limit=rpm_limit, tpm_limit=tpm_limit)
    session.add(key)
    session.flush()
    return CreatedKey(key, secret)


def verify_key(session: Session, secret: str) -> ApiKey | None:
    """The live key this secret belongs to, or None (unknown, malformed or revoked)."""
    if not secret.startswith("ms-") or secret.count("-") < 2 or len(secret) > 200:
        return None
    digest = hash_secret(secret)
    found = None
    for key in session.scalars(select(ApiKey).where(ApiKey.prefix == _prefix(secret))):
        if hmac.compare_digest(key.hashed_secret, digest):
            found = key
    if found is None or found.revoked_at is not None:
        return None
    return found


def revoke_key(session: Session, key_id: str) -> ApiKey:
    """Revoke (never delete: ledger rows point at the key). Revoking twice keeps the first time."""
    key = session.get(ApiKey, key_id)
    if key is None:
        raise KeyAdminError(f"no API key {key_id!r}")
    if key.revoked_at is None:
        key.revoked_at = datetime.now(timezone.utc)
        session.flush()
    return key


def list_keys(session: Session, project: str | None = None, include_revoked: bool = True) -> list[tuple[ApiKey, str]]:
    """(key, project name) pairs, oldest first."""
    q = select(ApiKey, Project.name).join(Project, Project.id == ApiKey.project_id).order_by(ApiKey.created_at,
                                                                                             ApiKey.id)
    if project is not None:
        q = q.where(Project.name == project)
    if not include_revoked:
        q = q.where(ApiKey.revoked_at.is_(None))
    return [(k, n) for k, n in session.execute(q).all()]


def effective_limits(key: ApiKey | None, default_rpm: int, default_tpm: int) -> tuple[int, int]:
    """(rpm, tpm) for a key: its own limits, else the Settings defaults; 0 = unlimited."""
    if key is None:
        return default_rpm, default_tpm
    return (default_rpm if key.rpm_limit is None else key.rpm_limit,
            default_tpm if key.tpm_limit is None else key.tpm_limit)
