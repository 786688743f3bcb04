"""Which paths are URLs of object storage, and how a URL is joined and shown: text only, so a
local path is told from a URL without loading the object store client (+50 ms)."""
from __future__ import annotations

import re

from turbotrain.printable import printable

SCHEMES = ("s3://", "gs://", "az://", "abfs://", "https://", "http://")


def is_url(path: object) -> bool:
    return isinstance(path, str) and path.lower().startswith(SCHEMES)


def join(url: str, name: str) -> str:
    return f"{url.rstrip('/')}/{name}"


def shown_url(url: str) -> str:
    """The URL without user info or query (a presigned URL's signature): safe to print."""
    url = re.sub(r"^([a-z0-9]+://)[^/@]*@", r"\1", url, flags=re.IGNORECASE)
    return printable(url.split("?", 1)[0])
