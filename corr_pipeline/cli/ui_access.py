"""Who may use what ``corr-pipeline ui`` serves: the holder of its token, nobody else.

:class:`TokenGate` is ASGI middleware around Dagster's web server (the model of Jupyter's
server). ``corr-pipeline ui`` makes a fresh secret (:func:`new_token`, 256 bits from
:mod:`secrets`) each time it starts and prints ``http://HOST:PORT/?token=TOKEN`` once, on its
owner's terminal. Then:

- a ``GET``/``HEAD`` request carrying the valid ``token`` query parameter gets a cookie holding
  the token (``HttpOnly``, ``SameSite=Strict``, named after the port: :func:`cookie_name`) and a
  redirect to the same address without the token, so the token leaves the address bar and the
  browser's history;
- an HTTP request with that cookie, with the valid ``token`` parameter, or with the header
  ``Authorization: Bearer TOKEN`` (scripts) is passed to Dagster;
- every other HTTP request is answered 401 and never reaches Dagster; a websocket handshake
  without the cookie or the parameter is closed before it is accepted (the client sees 403).

Tokens are compared with :func:`hmac.compare_digest` (no timing leak). The cookie is bound to
the host name the browser used, so a page of another site (even one whose name resolves to
127.0.0.1) neither holds it nor may send it (``SameSite=Strict``).
"""

from __future__ import annotations

import hmac
import secrets
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode

__all__ = ["TOKEN_PARAMETER", "TokenGate", "cookie_name", "new_token"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]

#: The query parameter that carries the token in the printed address.
TOKEN_PARAMETER = "token"
#: Websocket close code for a refused handshake (policy violation).
POLICY_VIOLATION = 1008
REFUSED = (
    b"corr-pipeline ui: not authorized; open the address with ?token=... that "
    b"corr-pipeline ui printed when it started\n"
)


def new_token() -> str:
    """A fresh secret for one start of the UI: 32 random bytes, URL-safe text."""
    return secrets.token_urlsafe(32)


def cookie_name(port: int) -> str:
    """The cookie of the UI on ``port`` (cookies ignore ports: two UIs on one host keep theirs
    apart by name)."""
    return f"corr_pipeline_ui_{port}"


def _header(scope: Scope, name: bytes) -> list[str]:
    return [v.decode("latin-1") for k, v in scope.get("headers", []) if k.lower() == name]


class TokenGate:
    """ASGI middleware: ``app`` for requests that prove they hold ``token`` (module docstring),
    401 or a closed websocket for all others. Lifespan events pass through."""

    def __init__(self, app: App, token: str, cookie: str) -> None:
        if not token:
            raise ValueError("TokenGate needs a non-empty token")
        self.app = app
        self._token = token.encode()
        self._cookie = cookie

    def _valid(self, candidate: str) -> bool:
        return hmac.compare_digest(candidate.encode("utf-8", "replace"), self._token)

    def _cookie_valid(self, scope: Scope) -> bool:
        for header in _header(scope, b"cookie"):
            for part in header.split(";"):
                name, _, value = part.strip().partition("=")
                if name == self._cookie and self._valid(value):
                    return True
        return False

    def _bearer_valid(self, scope: Scope) -> bool:
        for header in _header(scope, b"authorization"):
            kind, _, value = header.strip().partition(" ")
            if kind.lower() == "bearer" and self._valid(value.strip()):
                return True
        return False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        query = parse_qsl(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
        given = [value for name, value in query if name == TOKEN_PARAMETER]
        token_valid = bool(given) and all(self._valid(value) for value in given)
        if kind == "http" and token_valid and scope.get("method") in ("GET", "HEAD"):
            rest = [(name, value) for name, value in query if name != TOKEN_PARAMETER]
            await self._redirect_with_cookie(scope, send, rest)
            return
        if (
            token_valid
            or self._cookie_valid(scope)
            or (kind == "http" and self._bearer_valid(scope))
        ):
            await self.app(scope, receive, send)
            return
        if kind == "websocket":
            await send({"type": "websocket.close", "code": POLICY_VIOLATION})
            return
        await send(
            {
                "type": "http.response.start",
                "status": 401,
                "headers": [
                    (b"content-type", b"text/plain; charset=utf-8"),
                    (b"content-length", str(len(REFUSED)).encode()),
                    (b"cache-control", b"no-store"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": REFUSED})

    async def _redirect_with_cookie(
        self, scope: Scope, send: Send, rest: list[tuple[str, str]]
    ) -> None:
        """302 to the same path (on this server: never ``//host``) without the token, setting
        the cookie."""
        path = "/" + (scope.get("root_path", "") + scope.get("path", "/")).lstrip("/")
        location = quote(path) + (f"?{urlencode(rest)}" if rest else "")
        cookie = (
            f"{self._cookie}={self._token.decode()}; Path=/; HttpOnly; SameSite=Strict"
        ).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 302,
                "headers": [
                    (b"location", location.encode("latin-1")),
                    (b"set-cookie", cookie),
                    (b"cache-control", b"no-store"),
                    (b"content-length", b"0"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": b""})
