"""What every lab page shares below the views: the security headers, the refusal a page turns
into its error page, reading a posted form, and checking a POST's session and CSRF token."""

from __future__ import annotations

from urllib.parse import parse_qs

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from ragpipe.server.lab.login import COOKIE, LabSession, csrf_matches

MAX_FORM_BYTES = 8192
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


class LabRefusal(Exception):
    """A page that is not shown: its status and the one-line reason the error page gives."""

    def __init__(self, status: int, title: str, message: str):
        super().__init__(message)
        self.status, self.title, self.message = status, title, message


async def _form(request: Request) -> dict[str, str]:
    """An ``application/x-www-form-urlencoded`` body's first value per field (bounded); an empty
    body is an empty form (what a POST without fields sends)."""
    body = await request.body()
    if not body:
        return {}
    if request.headers.get("content-type", "").split(";")[0].strip() != "application/x-www-form-urlencoded":
        raise LabRefusal(415, "Unsupported form", "the form must be sent as application/x-www-form-urlencoded")
    if len(body) > MAX_FORM_BYTES:
        raise LabRefusal(413, "Form too large", f"a form may hold at most {MAX_FORM_BYTES} bytes")
    try:
        fields = parse_qs(body.decode("utf-8"), keep_blank_values=True, max_num_fields=16)
    except (UnicodeDecodeError, ValueError):
        raise LabRefusal(400, "Unreadable form", "the form cannot be parsed") from None
    return {k: v[0] for k, v in fields.items()}


async def posted_form(lab, request: Request) -> tuple[LabSession, dict[str, str]] | Response:
    """The session and form of a lab POST, or the response refusing it: a redirect to the login
    form without a session, the error page of an unreadable form, 403 without the CSRF token."""
    session = lab.sessions.get(request.cookies.get(COOKIE))
    if session is None:
        return RedirectResponse(
            f"{request.scope.get('root_path', '')}/login", status_code=303, headers=SECURITY_HEADERS
        )
    try:
        form = await _form(request)
    except LabRefusal as exc:
        return lab.render(request, "error.html", exc.status, title=exc.title, message=exc.message)
    if not csrf_matches(session, form.get("csrf")):
        return lab.render(request, "error.html", 403, title="Forbidden", message="missing or wrong CSRF token")
    return session, form
