"""The web console: `/` and the static files under mainspring/web, plus three.js when it was vendored.

The console is plain HTML and ES modules (no build step): the browser loads the files as they are, and every
figure on the page comes from the /v1 API with the caller's own key, so the console sees what that key may see
and nothing more. These routes carry no data and need no key: the page asks for one when the API answers 401.

three.js is not committed: the Makefile's install step (`make up`: npm install --no-save --prefix .cache/npm-web)
puts it under .cache/npm-web; without it the scene viewer says it is not installed instead of fetching a CDN.
"""

from __future__ import annotations

import base64
import hashlib
import re
from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import FileResponse, HTMLResponse

from mainspring.api.errors import APIError

router = APIRouter(include_in_schema=False)

WEB_DIR = Path(__file__).resolve().parents[2] / "web"
# next to the package in a checkout (editable install): where the Makefile's npm install puts it
VENDOR_DIR = Path(__file__).resolve().parents[3] / ".cache" / "npm-web" / "node_modules"
VENDORED = {"three": ("build", "examples/jsm")}  # package -> the folders of it the page may load

_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
          ".css": "text/css; charset=utf-8", ".svg": "image/svg+xml", ".png": "image/png"}


def _import_map_hash() -> str:
    """The CSP source of index.html's one inline script, the import map (GLTFLoader imports the bare 'three')."""
    html = (WEB_DIR / "index.html").read_text()
    m = re.search(r'<script type="importmap">(.*?)</script>', html, re.S)
    digest = hashlib.sha256((m.group(1) if m else "").encode()).digest()
    return f"'sha256-{base64.b64encode(digest).decode()}'"


# the page loads nothing from elsewhere: no CDN, and no inline script but the import map
CSP = (f"default-src 'self'; script-src 'self' {_import_map_hash()}; style-src 'self'; "
       "img-src 'self' data: blob:; connect-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'")
HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer",
           "Cache-Control": "no-cache"}


def inside(root: Path, relative: str) -> Path:
    """`relative` under `root`, or a 404: a path that climbs out (.., a symlink) is not a console file."""
    try:
        path = (root / relative).resolve()
        found = path.is_relative_to(root.resolve()) and path.is_file()
    except (ValueError, OSError):  # a NUL byte, a name too long: no file of ours either
        found = False
    if not found:
        raise APIError(404, f"no console file {relative!r}", code="not_found")
    return path


def static(path: Path) -> FileResponse:
    return FileResponse(path, media_type=_TYPES.get(path.suffix, "application/octet-stream"), headers=HEADERS)


@router.get("/", response_class=HTMLResponse)
async def index() -> FileResponse:
    return static(WEB_DIR / "index.html")


@router.get("/console/vendor/{package}/{path:path}")
async def vendored(package: str, path: str) -> FileResponse:
    folder = next((f for f in VENDORED.get(package, ()) if path.startswith(f + "/")), None)
    if folder is None:
        raise APIError(404, f"no vendored file {package}/{path}", code="not_found")
    if not (VENDOR_DIR / package).is_dir():
        raise APIError(404, f"{package} is not installed: see docs/console.md (npm install into .cache/npm-web)",
                       code="vendor_not_installed")
    return static(inside(VENDOR_DIR / package / folder, path[len(folder) + 1:]))  # `..` cannot leave the folder


@router.get("/console/{path:path}")
async def asset(path: str) -> FileResponse:
    return static(inside(WEB_DIR, path))
