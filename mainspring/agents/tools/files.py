"""`files`: read, write, list and delete files in the run's workspace, and nowhere else."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Literal, Optional

from mainspring.agents.tools.base import ToolContext, ToolError, ToolResult
from mainspring.agents.tools.decorator import FunctionTool, tool
from mainspring.agents.tools.paths import relative_name, workspace_path, write_file_nofollow
from mainspring.config import Settings

READ_CHARS = 100_000  # per call; the model pages on with `offset`
WRITE_BYTES = 10 << 20
LIST_ENTRIES = 500
FileAction = Literal["read", "write", "list", "delete"]


def files_tool(settings: Settings | None = None) -> FunctionTool:
    read_chars = int(getattr(settings, "agent_files_read_chars", READ_CHARS))
    write_bytes = int(getattr(settings, "agent_files_write_bytes", WRITE_BYTES))

    @tool(name="files", idempotent=False, requires_approval=False, timeout_s=30)
    def files(ctx: ToolContext, action: FileAction, path: str = ".", content: Optional[str] = None,
              offset: int = 0) -> ToolResult:
        """Work with files in this run's workspace (the same folder the python and shell tools see as their
        working directory). Paths are relative to the workspace.

        Args:
            action: read a text file, write (create or replace) a file, list a folder recursively, or delete a
                file or an empty folder
            path: file or folder path relative to the workspace; "." is the workspace itself (for list)
            content: the text to write (write only)
            offset: character offset to start reading from, for files longer than one read
        """
        workspace = Path(ctx.workspace)
        workspace.mkdir(parents=True, exist_ok=True)
        if action == "list":
            return _list(workspace, path)
        if action == "read":
            return _read(workspace, path, max(offset, 0), read_chars)
        if action == "write":
            if content is None:
                raise ToolError("write needs `content`")
            return _write(workspace, path, content, write_bytes)
        return _delete(workspace, path)

    return files


def _list(workspace: Path, name: str) -> ToolResult:
    folder = workspace_path(workspace, name, allow_root=True)
    if not folder.is_dir():
        raise ToolError(f"{name!r} is not a folder in the workspace")
    entries: list[dict] = []
    truncated = False
    for root, dirs, names in os.walk(folder, followlinks=False):
        dirs.sort()
        for entry in sorted(dirs) + sorted(names):
            full = Path(root) / entry
            info = os.lstat(full)
            kind = "dir" if stat.S_ISDIR(info.st_mode) else "link" if stat.S_ISLNK(info.st_mode) else "file"
            if len(entries) >= LIST_ENTRIES:
                truncated = True
                break
            entries.append({"path": relative_name(workspace, full), "type": kind,
                            "size": info.st_size if kind == "file" else None})
        if truncated:
            break
    entries.sort(key=lambda e: e["path"])
    lines = [f"{e['path']}/" if e["type"] == "dir" else f"{e['path']} -> (link)" if e["type"] == "link"
             else f"{e['path']} ({e['size']} bytes)" for e in entries]
    if not lines:
        lines = ["(empty)"]
    if truncated:
        lines.append(f"[listing stopped at {LIST_ENTRIES} entries]")
    return ToolResult("\n".join(lines), data={"entries": entries, "truncated": truncated})


def _read(workspace: Path, name: str, offset: int, cap: int) -> ToolResult:
    path = workspace_path(workspace, name)
    if not path.is_file():
        raise ToolError(f"no file {name!r} in the workspace")
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if text is None or "\x00" in text:
        return ToolResult(f"{name} is a binary file ({len(raw)} bytes); it cannot be shown as text",
                          data={"path": name, "binary": True, "size": len(raw)})
    piece = text[offset:offset + cap]
    end = offset + len(piece)
    truncated = end < len(text)
    note = f"\n[showing characters {offset}-{end} of {len(text)}; read again with offset={end} for more]" \
        if truncated or offset else ""
    return ToolResult(piece + note, data={"path": name, "offset": offset, "end": end, "total_chars": len(text),
                                          "truncated": truncated})


def _write(workspace: Path, name: str, content: str, cap: int) -> ToolResult:
    data = content.encode("utf-8")
    if len(data) > cap:
        raise ToolError(f"content is {len(data)} bytes; the files tool writes at most {cap} bytes at once")
    path = workspace_path(workspace, name)
    if path.is_dir():
        raise ToolError(f"{name!r} is a folder")
    try:
        write_file_nofollow(path, data)
    except OSError as exc:
        raise ToolError(f"cannot write {name!r}: {exc.strerror}") from exc
    return ToolResult(f"wrote {len(data)} bytes to {relative_name(workspace, path)}",
                      data={"path": relative_name(workspace, path), "bytes": len(data)})


def _delete(workspace: Path, name: str) -> ToolResult:
    path = workspace_path(workspace, name)
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.is_dir():
        try:
            path.rmdir()
        except OSError:
            raise ToolError(f"folder {name!r} is not empty; delete its files first") from None
    else:
        raise ToolError(f"no file or folder {name!r} in the workspace")
    return ToolResult(f"deleted {name}", data={"path": relative_name(workspace, path)})
