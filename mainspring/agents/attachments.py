"""What a run may attach for its tools to read: files its own project uploaded (/v1/files ids), or server paths
under the roots the operator allows (MAINSPRING_AGENT_ATTACH_ROOTS). Never the data directory (the platform's
database, keys, other projects' uploads) and never the platform's database files, wherever they live.

A path is checked when the run is created and again each time a tool is about to read it: a symlink swapped in
later, or a root the operator has since removed, is refused then too. Resolution follows symlinks first, so a
link from an allowed root to a forbidden file is judged by where it points.
"""

from __future__ import annotations

import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from sqlalchemy import select

from mainspring.agents.journal import JournalError
from mainspring.config import Settings
from mainspring.store.db import is_platform_db, session
from mainspring.store.tables import ApiKey, FileRow

KINDS = ("docs", "db")  # docs: a folder (search, files tools); db: a database file (sql tool)
FILE_ID_PREFIX = "file-"
MATERIALIZED = "attachments"  # <data_dir>/attachments/<id>/: the folder a list of uploaded files becomes


class AttachmentRefused(JournalError):
    def __init__(self, message: str):
        super().__init__(message, status=400)


@dataclass(frozen=True)
class AttachmentPolicy:
    roots: tuple[Path, ...]  # resolved
    data_dir: Path  # resolved
    settings: Settings  # names the platform database (store.db.is_platform_db)

    @classmethod
    def from_settings(cls, settings: Settings) -> AttachmentPolicy:
        return cls(tuple(Path(r).expanduser().resolve() for r in settings.agent_attach_roots),
                   settings.data_dir.resolve(), settings)

    def check_path(self, kind: str, path: str | Path, *, stored: bool = False) -> Path:
        """The resolved path when a run may read it as attachment `kind`; AttachmentRefused otherwise.
        `stored`: a path `resolve` wrote into the run, which may be the project's own upload in the data dir."""
        real = Path(os.path.realpath(path))
        if is_platform_db(real, self.settings):  # any name of it: a link, a hard link, its -wal / -shm
            raise AttachmentRefused(f"attachment {kind!r}: the platform's own database cannot be attached")
        if real.is_relative_to(self.data_dir):
            own = self.data_dir / "files", self.data_dir / MATERIALIZED  # what start_run itself put there
            if stored and any(real.is_relative_to(d) for d in own) and not Path(path).is_symlink():
                return real
            raise AttachmentRefused(f"attachment {kind!r}: the server's data directory cannot be attached; "
                                    "upload the file (POST /v1/files) and attach its id")
        if not any(real.is_relative_to(root) for root in self.roots):
            allowed = ", ".join(str(r) for r in self.roots) or "none configured (MAINSPRING_AGENT_ATTACH_ROOTS)"
            raise AttachmentRefused(f"attachment {kind!r}: {path} is outside the attachable roots ({allowed}); "
                                    "upload the file (POST /v1/files) and attach its id instead")
        return real

    # ---- at run creation ----------------------------------------------------------------------------------
    def resolve(self, db_url: str, project_id: int | None, raw: dict[str, str | list[str]]) -> dict[str, str]:
        """The run's attachments as checked server paths, from paths or ids of files the project uploaded."""
        out: dict[str, str] = {}
        for kind, value in raw.items():
            if kind not in KINDS:
                raise AttachmentRefused(f"unknown attachment {kind!r}; use one of {', '.join(KINDS)}")
            if isinstance(value, list):
                ids = value
            elif value.startswith(FILE_ID_PREFIX):
                ids = [value]
            else:
                out[kind] = str(self._existing(kind, self.check_path(kind, value)))
                continue
            files = self._uploaded(db_url, project_id, ids, kind)
            if kind == "db":
                if len(files) != 1:
                    raise AttachmentRefused("attachment 'db' is one database: give one file id")
                out[kind] = str(next(self._folder(files).iterdir()))  # its own name: .duckdb picks the engine
            else:
                out[kind] = str(self._folder(files))
        return out

    def _existing(self, kind: str, path: Path) -> Path:
        if kind == "docs" and not path.is_dir():
            raise AttachmentRefused(f"attachment 'docs' must be a folder on the server: {path} is not one")
        if kind == "db" and not path.is_file():
            raise AttachmentRefused(f"attachment 'db' must be a database file on the server: {path} is not one")
        return path

    def _uploaded(self, db_url: str, project_id: int | None, ids: Sequence[str],
                  kind: str) -> list[tuple[str, Path]]:
        """(filename, content path) of each id; an id the project did not upload is unknown (no existence leak)."""
        if not ids:
            raise AttachmentRefused(f"attachment {kind!r}: the list of file ids is empty")
        with session(db_url, readonly=True) as s:
            q = select(FileRow).where(FileRow.id.in_(list(ids)))
            if project_id is None:
                q = q.where(FileRow.api_key_id.is_(None))
            else:
                q = q.where(FileRow.api_key_id.in_(select(ApiKey.id).where(ApiKey.project_id == project_id)))
            rows = {r.id: r for r in s.scalars(q)}
        missing = [i for i in ids if i not in rows]
        if missing:
            raise JournalError(f"attachment {kind!r}: no file {missing[0]!r}", status=404)
        return [(rows[i].filename, self.data_dir / rows[i].path) for i in ids]

    def _folder(self, files: list[tuple[str, Path]]) -> Path:
        """A folder of the uploaded files under their own names (hard links where the filesystem allows)."""
        folder = self.data_dir / MATERIALIZED / uuid.uuid4().hex
        folder.mkdir(parents=True)
        for i, (filename, content) in enumerate(files):
            name = Path(filename).name.lstrip(".") or f"file-{i}"
            target = folder / name
            if target.exists():
                target = folder / f"{i}-{name}"
            try:
                os.link(content, target)
            except OSError:
                shutil.copyfile(content, target)
        return folder
