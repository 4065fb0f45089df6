"""The Files API (OpenAI's /v1/files): uploads kept on disk under `data_dir/files/<id>`, one row each in `files`.

Bytes live on disk, not in the database: batch inputs reach 100 MB. A file is written under a
temporary name, fsynced and renamed, and only then gets its row, so a row always points at complete
content. Each file belongs to the key that uploaded it (anonymous callers share the anonymous
files); another caller's file is a 404, as if it did not exist.

python-multipart is not a dependency, so the upload is parsed here: the body is spooled to disk
(never held in memory) and the parts are found in a memory map of it.
"""

from __future__ import annotations

import asyncio
import email.message
import hashlib
import json
import mmap
import os
import uuid
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, BinaryIO, Callable, Literal

from fastapi import APIRouter, Query, Request
from fastapi.responses import FileResponse
from pydantic import BaseModel
from sqlalchemy import or_, select
from sqlalchemy.engine import Engine

from mainspring.api.errors import APIError, bad_request
from mainspring.config import Settings
from mainspring.store.db import session
from mainspring.store.tables import BatchRow, FileRow
from mainspring.store.ids import new_id

router = APIRouter()

MAX_BYTES = 100 * 1024 * 1024  # our cap (OpenAI allows 200 MB for batch inputs)
MAX_BATCH_LINES = 50_000  # OpenAI's limit on requests per batch
UPLOAD_PURPOSES = ("batch", "fine-tune", "assistants", "vision", "user_data", "evals")
_COPY_CHUNK = 1 << 20


class FileObject(BaseModel):
    id: str
    object: Literal["file"] = "file"
    bytes: int
    created_at: int
    filename: str
    purpose: str
    status: str = "processed"
    status_details: str | None = None
    expires_at: int | None = None


def file_object(row: FileRow) -> FileObject:
    return FileObject(id=row.id, bytes=row.bytes, created_at=int(row.created_at.timestamp()), filename=row.filename,
                      purpose=row.purpose)


def files_dir(settings: Settings) -> Path:
    return settings.data_dir / "files"


def content_path(settings: Settings, row: FileRow) -> Path:
    return settings.data_dir / row.path


# ---- storage (also used by the batch runner for its output files) -------------------------------------
def write_atomic(path: Path, write: Callable[[BinaryIO], None]) -> tuple[int, str]:
    """Write via `write(fh)` to a temporary name, fsync, rename over `path`; (bytes, sha256)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".tmp-{path.name}-{uuid.uuid4().hex[:8]}")
    digest, size = hashlib.sha256(), 0
    try:
        with open(tmp, "wb") as raw:
            class _Hashing:  # counts and hashes on the way to disk: no second read of 100 MB
                def write(self, b: bytes) -> None:
                    nonlocal size
                    digest.update(b)
                    size += len(b)
                    raw.write(b)
            write(_Hashing())  # type: ignore[arg-type]
            raw.flush()
            os.fsync(raw.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return size, digest.hexdigest()


def store_file(db: Engine, settings: Settings, file_id: str, *, purpose: str, filename: str,
               write: Callable[[BinaryIO], None], api_key_id: str | None) -> FileRow:
    """Content on disk, then the row; a row already there under `file_id` is returned as is (a rerun)."""
    with session(db, readonly=True) as s:
        existing = s.get(FileRow, file_id)
    if existing is not None:
        return existing
    rel = f"files/{file_id}"
    size, sha = write_atomic(settings.data_dir / rel, write)
    row = FileRow(id=file_id, purpose=purpose, filename=filename, bytes=size, sha256=sha, path=rel,
                  api_key_id=api_key_id)
    try:
        with session(db) as s:
            s.add(row)
    except Exception:
        (settings.data_dir / rel).unlink(missing_ok=True)
        raise
    return row


def visible(principal: Any):
    """The SQL condition for rows `principal` may see: its own (anonymous: the anonymous ones)."""
    return FileRow.api_key_id == principal.id if principal is not None else FileRow.api_key_id.is_(None)


def get_owned(s: Any, file_id: str, principal: Any) -> FileRow:
    row = s.scalar(select(FileRow).where(FileRow.id == file_id, visible(principal)))
    if row is None:
        raise APIError(404, f"No such File object: {file_id}", param="file_id", code="file_not_found")
    return row


# ---- multipart --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Part:
    filename: str | None
    start: int
    end: int


def _boundary(content_type: str) -> bytes:
    m = email.message.Message()
    m["content-type"] = content_type
    boundary = m.get_param("boundary")
    if m.get_content_type() != "multipart/form-data" or not isinstance(boundary, str) or not boundary:
        raise bad_request("upload the file as multipart/form-data with fields `file` and `purpose`")
    return boundary.encode("latin-1")


def _parts(mm: mmap.mmap, boundary: bytes) -> dict[str, _Part]:
    """RFC 7578 parts by field name, as byte ranges of the spooled body."""
    delim = b"--" + boundary
    pos = mm.find(delim)
    parts: dict[str, _Part] = {}
    while pos >= 0:
        pos += len(delim)
        if mm[pos:pos + 2] == b"--":  # the closing delimiter
            return parts
        head_start = mm.find(b"\r\n", pos) + 2
        head_end = mm.find(b"\r\n\r\n", head_start)
        if head_start < 2 or head_end < 0:
            break
        headers = email.message.Message()
        for line in mm[head_start:head_end].decode("utf-8", "replace").split("\r\n"):
            name, _, value = line.partition(":")
            headers[name.strip()] = value.strip()
        end = mm.find(b"\r\n" + delim, head_end + 4)
        if end < 0:
            break
        field = headers.get_param("name", header="content-disposition")
        if isinstance(field, str):
            parts[field] = _Part(headers.get_filename(), head_end + 4, end)
        pos = end + 2
    raise bad_request("the multipart body is malformed or cut short")


def _check_batch_jsonl(mm: mmap.mmap, part: _Part) -> None:
    """UTF-8, at most MAX_BATCH_LINES non-blank lines, at least one a JSON object. A bad line does not
    fail the upload: it fails only its own request when the batch runs (the error file names it)."""
    pos, lines, objects = part.start, 0, 0
    while pos < part.end:
        nl = mm.find(b"\n", pos, part.end)
        nl = part.end if nl < 0 else nl
        raw = mm[pos:nl]
        pos = nl + 1
        try:
            text = raw.decode("utf-8").strip()
        except UnicodeDecodeError:
            raise bad_request(f"line {lines + 1} of the file is not UTF-8; batch files are JSONL", param="file")
        if not text:
            continue
        lines += 1
        if lines > MAX_BATCH_LINES:
            raise bad_request(f"a batch file has at most {MAX_BATCH_LINES} requests", param="file")
        if not objects:
            try:
                objects += isinstance(json.loads(text), dict)
            except ValueError:
                pass
    if not objects:
        raise bad_request("the file has no JSON object lines; a batch file is JSONL, one request object a line",
                          param="file", code="invalid_file_format")


@dataclass(frozen=True)
class _Upload:
    file_id: str
    purpose: str
    filename: str
    path: Path  # the content, already under its final name
    bytes: int
    sha256: str


def _accept_upload(spool: Path, boundary: bytes, settings: Settings) -> _Upload:
    """Checks the spooled body and writes the file part under its final name. Runs on a worker thread."""
    if spool.stat().st_size == 0:
        raise bad_request("the upload is empty; send fields `file` and `purpose`")
    with open(spool, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        parts = _parts(mm, boundary)
        if "purpose" not in parts:
            raise APIError(400, "missing required parameter: 'purpose'", param="purpose",
                           code="missing_required_parameter")
        if "file" not in parts or parts["file"].filename is None:
            raise APIError(400, "missing required parameter: 'file' (a file part)", param="file",
                           code="missing_required_parameter")
        p = parts["purpose"]
        purpose = mm[p.start:p.end].decode("utf-8", "replace").strip()
        if purpose not in UPLOAD_PURPOSES:
            raise bad_request(f"purpose {purpose!r} is not one of {', '.join(UPLOAD_PURPOSES)}", param="purpose")
        f = parts["file"]
        if f.end - f.start > MAX_BYTES:
            raise APIError(413, f"the file is larger than {MAX_BYTES // 2**20} MB", param="file")
        if f.end == f.start:
            raise bad_request("the file is empty", param="file")
        if purpose == "batch":
            _check_batch_jsonl(mm, f)
        file_id = new_id("file-")

        def copy(out: BinaryIO) -> None:
            for at in range(f.start, f.end, _COPY_CHUNK):
                out.write(mm[at:min(at + _COPY_CHUNK, f.end)])

        path = files_dir(settings) / file_id
        size, sha = write_atomic(path, copy)
        return _Upload(file_id, purpose, os.path.basename(f.filename or "upload"), path, size, sha)


# ---- routes ------------------------------------------------------------------------------------------
def _db(request: Request) -> Engine:
    return request.app.state.economics.db


_UPLOAD_SCHEMA = {"requestBody": {"required": True, "content": {"multipart/form-data": {"schema": {
    "type": "object", "required": ["file", "purpose"],
    "properties": {"file": {"type": "string", "format": "binary"},
                   "purpose": {"type": "string", "enum": list(UPLOAD_PURPOSES)}}}}}}}


@router.post("/v1/files", openapi_extra=_UPLOAD_SCHEMA)  # the body is parsed here, so FastAPI cannot describe it
async def create_file(request: Request) -> FileObject:
    settings: Settings = request.app.state.settings
    boundary = _boundary(request.headers.get("content-type", ""))
    if int(request.headers.get("content-length") or 0) > MAX_BYTES + 65536:
        raise APIError(413, f"the file is larger than {MAX_BYTES // 2**20} MB", param="file")
    spool_dir = files_dir(settings)
    spool_dir.mkdir(parents=True, exist_ok=True)
    spool = spool_dir / f".upload-{uuid.uuid4().hex}"
    try:
        with open(spool, "wb") as fh:
            size = 0
            async for chunk in request.stream():
                size += len(chunk)
                if size > MAX_BYTES + 65536:  # a lying or absent Content-Length
                    raise APIError(413, f"the file is larger than {MAX_BYTES // 2**20} MB", param="file")
                fh.write(chunk)
        up = await asyncio.to_thread(_accept_upload, spool, boundary, settings)
    finally:
        spool.unlink(missing_ok=True)
    principal = request.state.principal
    row = FileRow(id=up.file_id, purpose=up.purpose, filename=up.filename, bytes=up.bytes, sha256=up.sha256,
                  path=f"files/{up.file_id}", api_key_id=principal.id if principal is not None else None)

    def insert() -> None:
        with session(_db(request)) as s:
            s.add(row)

    try:
        await asyncio.to_thread(insert)
    except BaseException:
        up.path.unlink(missing_ok=True)
        raise
    return file_object(row)


@router.get("/v1/files")
async def list_files(request: Request, purpose: str | None = None, after: str | None = None,
                     limit: int = Query(10_000, ge=1, le=10_000), order: Literal["asc", "desc"] = "desc") -> dict:
    principal = request.state.principal

    def query() -> tuple[list[FileRow], bool]:
        with session(_db(request), readonly=True) as s:
            q = select(FileRow).where(visible(principal))
            if purpose:
                q = q.where(FileRow.purpose == purpose)
            if after:
                cursor = get_owned(s, after, principal)
                q = q.where(_beyond(cursor, order))
            keys = (FileRow.created_at, FileRow.id)
            q = q.order_by(*(k.desc() if order == "desc" else k.asc() for k in keys)).limit(limit + 1)
            rows = list(s.scalars(q))
        return rows[:limit], len(rows) > limit

    rows, more = await asyncio.to_thread(query)
    return {"object": "list", "data": [file_object(r).model_dump() for r in rows],
            "first_id": rows[0].id if rows else None, "last_id": rows[-1].id if rows else None, "has_more": more}


def _beyond(cursor: FileRow, order: str):
    t: datetime = cursor.created_at
    if order == "desc":
        return or_(FileRow.created_at < t, (FileRow.created_at == t) & (FileRow.id < cursor.id))
    return or_(FileRow.created_at > t, (FileRow.created_at == t) & (FileRow.id > cursor.id))


@router.get("/v1/files/{file_id}")
async def retrieve_file(file_id: str, request: Request) -> FileObject:
    def get() -> FileRow:
        with session(_db(request), readonly=True) as s:
            return get_owned(s, file_id, request.state.principal)

    return file_object(await asyncio.to_thread(get))


@router.get("/v1/files/{file_id}/content")
async def file_content(file_id: str, request: Request) -> FileResponse:
    def get() -> FileRow:
        with session(_db(request), readonly=True) as s:
            return get_owned(s, file_id, request.state.principal)

    row = await asyncio.to_thread(get)
    path = content_path(request.app.state.settings, row)
    if not path.is_file():
        raise APIError(500, f"the content of {file_id} is missing from the server's data directory",
                       code="file_content_missing")
    return FileResponse(path, media_type="application/octet-stream", filename=row.filename)


@router.delete("/v1/files/{file_id}")
async def delete_file(file_id: str, request: Request) -> dict:
    settings: Settings = request.app.state.settings

    def delete() -> None:
        with session(_db(request)) as s:
            row = get_owned(s, file_id, request.state.principal)
            used = s.scalar(select(BatchRow.id).where(or_(BatchRow.input_file_id == file_id,
                                                          BatchRow.output_file_id == file_id,
                                                          BatchRow.error_file_id == file_id)).limit(1))
            if used is not None:  # the batch's record (and its runner, while it runs) points at this file
                raise APIError(400, f"file {file_id} belongs to batch {used}; it cannot be deleted",
                               param="file_id", code="file_in_use")
            s.delete(row)
            path = content_path(settings, row)
        path.unlink(missing_ok=True)  # after the commit: a failed delete must not lose the content

    await asyncio.to_thread(delete)
    return {"id": file_id, "object": "file", "deleted": True}
