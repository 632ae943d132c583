"""The Host check: a request whose Host header names no address of this server gets 400.

The JSON-only POSTs and the missing CORS headers (seq2seq.serving.server) keep other sites' pages
from calling the API through a visitor's browser, as long as the browser knows they are other
sites. A page whose name its owner points at 127.0.0.1 once it has loaded (DNS rebinding) is, to
the browser, the same site as the server it then reaches: only the Host header still says which
name it used. So the server answers the names it is known by, `localhost`, `127.0.0.1`, `[::1]`
and its `--host`, and those of `--allow-host` (`*`: any), and refuses every other with one line.
"""

import json

from starlette.types import ASGIApp, Receive, Scope, Send

LOCAL = ("localhost", "127.0.0.1", "[::1]")


def host_name(header: str) -> str:
    """The name in a Host header, port dropped, in lower case: `[::1]:8000` -> `[::1]`."""
    header = header.strip().lower()
    if header.startswith("["):  # an IPv6 address keeps its brackets
        return header[: header.find("]") + 1] if "]" in header else header
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


def known_names(host: str, allowed: tuple[str, ...] = ()) -> frozenset[str]:
    """The names a server listening on `host` answers: LOCAL, `host` (an IPv6 one in brackets)
    and `allowed`."""
    own = f"[{host}]" if ":" in host and not host.startswith("[") else host
    return frozenset(name.lower() for name in (*LOCAL, own, *allowed))


class HostCheck:
    """Middleware: 400 with `{"error": ...}` for a request whose Host is not in `names` (unless
    `names` holds `*`)."""

    def __init__(self, app: ASGIApp, names: frozenset[str]) -> None:
        self.app, self.names = app, names

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or "*" in self.names:
            return await self.app(scope, receive, send)
        headers = dict(scope["headers"])
        header = headers.get(b"host", b"").decode("latin-1")
        if host_name(header) in self.names:
            return await self.app(scope, receive, send)
        shown = header if len(header) <= 40 else header[:37] + "..."
        message = f"Host {shown!r} is not a name of this server (--allow-host adds one)"
        body = json.dumps({"error": message}, separators=(",", ":")).encode()
        await send({"type": "http.response.start", "status": 400, "headers": [
            (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
        ]})  # fmt: skip
        await send({"type": "http.response.body", "body": body})
