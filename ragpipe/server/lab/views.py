"""The lab's routes: plain server-rendered pages (``lab_app``), mounted at ``/lab`` by the server.

| route | page |
|---|---|
| ``GET /lab/login``, ``POST /lab/login`` | the key form; a reviewer key opens a session (``login.py``) |
| ``POST /lab/logout`` | ends the session (CSRF token required) |
| ``GET /lab/runs`` | every evaluation run of the home: status, bundle, plan, cells |
| ``GET /lab/runs/{run}`` | one verified run: metrics, its cases, its files |
| ``GET /lab/runs/{run}/ledger`` | the run's ledger records (anchors ``#record-<seq>``) |
| ``GET /lab/runs/{run}/files/{path}`` | a file of the run folder (ledger, inputs, traces, report) |
| ``GET /lab/runs/{run}/cases/{case}/{repeat}`` | the trace inspector: channels, fusion, final hits, context, answer |
| ``GET /lab/compare?incumbent=&challenger=`` | two runs paired and compared by the experiment's code |
| ``GET /lab/corpus``, ``GET /lab/corpus/{revision}`` | a revision's snapshot, exclusions and counts |
| ``/lab/review…``, ``/lab/pairwise`` | the review queue, in-browser signing, freezing, pairwise review (``review_views.py``) |
| ``GET /lab/static/{lab.css,lab.js}`` | the vendored style sheet and script |

Every page carries ``Content-Security-Policy: default-src 'self'`` (no inline script or style runs),
``X-Frame-Options: DENY``, ``Referrer-Policy: no-referrer`` and ``Cache-Control: no-store``.
Without a session a page redirects to the login form (303); pages count against the key's rate
limit (429 page with ``Retry-After``, like the API); a key without the ``reviewer`` role
gets a 403 page; an unknown run, case, file or revision a 404 page; a POST without the session's
CSRF token a 403 page. Templates are autoescaped: queries, titles and texts render as text.
"""

from __future__ import annotations

import logging
from pathlib import Path
from urllib.parse import quote

import anyio
from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import FileResponse, HTMLResponse, RedirectResponse, Response
from starlette.routing import Route

from ragpipe.server.auth import Caller
from ragpipe.server.errors import ApiError
from ragpipe.server.lab.forms import SECURITY_HEADERS, LabRefusal, _form, posted_form
from ragpipe.server.lab.login import COOKIE, REVIEWER, LabSession, LabSessions
from ragpipe.server.lab.readers import LabReader, NotFound, Unverified
from ragpipe.server.lab.review_views import review_routes

HERE = Path(__file__).resolve().parent
STATIC = {"lab.css": "text/css; charset=utf-8", "lab.js": "text/javascript; charset=utf-8"}
log = logging.getLogger("ragpipe.server")


def templates() -> Environment:
    env = Environment(
        loader=FileSystemLoader(HERE / "templates"),
        autoescape=select_autoescape(default=True, default_for_string=True),
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["q"] = lambda value: quote(str(value), safe="")
    env.filters["num"] = lambda value: "–" if value is None else (f"{value:.4f}" if isinstance(value, float) else value)
    return env


class Lab:
    """What the pages share: the service's keys, limiter and redactor, the reader, the sessions."""

    def __init__(self, service):
        self.service = service
        self.reader = LabReader(service.ws, service.redact)
        self.sessions = LabSessions()
        self.env = templates()

    def render(
        self,
        request: Request,
        name: str,
        status: int = 200,
        session: LabSession | None = None,
        headers: dict[str, str] | None = None,
        **values,
    ) -> HTMLResponse:
        body = self.env.get_template(name).render(base=request.scope.get("root_path", ""), session=session, **values)
        return HTMLResponse(body, status_code=status, headers={**SECURITY_HEADERS, **(headers or {})})

    def session(self, request: Request) -> LabSession:
        found = self.sessions.get(request.cookies.get(COOKIE))
        if found is None:
            raise _Redirect(f"{request.scope.get('root_path', '')}/login")
        return found


class _Redirect(Exception):
    def __init__(self, location: str):
        self.location = location


def _repeat(raw: str) -> int:
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 6:
        raise NotFound(f"repeat {raw!r} is not a repeat number")
    return int(raw)


def lab_app(service) -> Starlette:
    """The lab over ``service`` (``ragpipe.server.app.Service``): its keys, limiter, redactor and home."""
    lab = Lab(service)

    def page(handler):
        """Run ``handler(request, session)`` in a worker thread (pages read files) and turn its
        refusals into error pages; an unforeseen error is logged whole and shown as one line."""

        async def endpoint(request: Request) -> Response:
            try:
                session = lab.session(request)
                lab.service.limit(session.caller.rate_key)  # pages count against the key's rate limit
                return await anyio.to_thread.run_sync(handler, request, session)
            except ApiError as limited:  # 429 rate_limited, with Retry-After
                return lab.render(
                    request,
                    "error.html",
                    limited.status,
                    None,
                    limited.headers,
                    title="Too many requests",
                    message=limited.message,
                )
            except _Redirect as redirect:
                return RedirectResponse(redirect.location, status_code=303, headers=SECURITY_HEADERS)
            except NotFound as exc:
                return lab.render(request, "error.html", 404, None, title="Not found", message=str(exc))
            except LabRefusal as exc:
                return lab.render(request, "error.html", exc.status, None, title=exc.title, message=exc.message)
            except Exception as exc:  # the traceback is for the operator's log only
                log.error("internal error on %s", request.url.path, exc_info=exc)
                return lab.render(request, "error.html", 500, None, title="Internal error", message="internal error")

        return endpoint

    async def login_form(request: Request) -> Response:
        return lab.render(request, "login.html")

    async def login(request: Request) -> Response:
        client = request.client.host if request.client else "-"
        try:
            form = await _form(request)
        except LabRefusal as exc:
            return lab.render(request, "error.html", exc.status, title=exc.title, message=exc.message)
        try:
            caller: Caller = lab.service.keys.authenticate(f"Bearer {form.get('key', '').strip()}", client)
        except ApiError:
            try:
                lab.service.limit(f"refused:{client}")  # guessing keys counts against the address
            except ApiError as limited:
                return lab.render(
                    request,
                    "error.html",
                    429,
                    None,
                    limited.headers,
                    title="Too many attempts",
                    message=limited.message,
                )
            return lab.render(request, "login.html", 401, error="unknown API key")
        if REVIEWER not in caller.roles:
            message = (
                f"key of {caller.subject.principal!r} has no reviewer role: the lab is for reviewers (docs/lab.md)"
            )
            return lab.render(request, "error.html", 403, title="Forbidden", message=message)
        token, _ = lab.sessions.open(caller)
        response = RedirectResponse(
            f"{request.scope.get('root_path', '')}/runs", status_code=303, headers=SECURITY_HEADERS
        )
        response.set_cookie(
            COOKIE,
            token,
            max_age=int(lab.sessions.ttl_s),
            path=request.scope.get("root_path", "") or "/",
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
        )
        return response

    async def logout(request: Request) -> Response:
        checked = await posted_form(lab, request)
        if isinstance(checked, Response):
            return checked
        lab.sessions.close(request.cookies.get(COOKIE))
        response = RedirectResponse(
            f"{request.scope.get('root_path', '')}/login", status_code=303, headers=SECURITY_HEADERS
        )
        response.delete_cookie(COOKIE, path=request.scope.get("root_path", "") or "/")
        return response

    async def static(request: Request) -> Response:
        name = request.path_params["name"]
        if name not in STATIC:
            return lab.render(request, "error.html", 404, title="Not found", message=f"no static file {name!r}")
        return FileResponse(HERE / "static" / name, media_type=STATIC[name], headers=SECURITY_HEADERS)

    async def home(request: Request) -> Response:
        return RedirectResponse(f"{request.scope.get('root_path', '')}/runs", status_code=303)

    @page
    def runs(request: Request, session: LabSession) -> Response:
        return lab.render(request, "runs.html", session=session, runs=lab.reader.runs())

    def _verified(run_id: str):
        try:
            return lab.reader.run(run_id)
        except Unverified as exc:
            raise LabRefusal(409, "Run does not verify", str(exc)) from None

    @page
    def run(request: Request, session: LabSession) -> Response:
        verified = _verified(request.path_params["run_id"])
        summary = None
        if verified.arm is not None:
            from ragpipe.experiment.arms import summarize

            summary = summarize(verified.arm)
        return lab.render(
            request, "run.html", session=session, run=verified, summary=summary, files=lab.reader.files(verified)
        )

    @page
    def ledger(request: Request, session: LabSession) -> Response:
        verified = _verified(request.path_params["run_id"])
        return lab.render(request, "ledger.html", session=session, run=verified)

    @page
    def run_file(request: Request, session: LabSession) -> Response:
        path = lab.reader.run_file(request.path_params["run_id"], request.path_params["path"])
        text = path.suffix in (".jsonl", ".json", ".head", ".md")
        headers = {
            **SECURITY_HEADERS,
            "Content-Disposition": f'{"inline" if text else "attachment"}; filename="{path.name}"',
        }
        media = "text/plain; charset=utf-8" if text else "application/octet-stream"
        return Response(path.read_bytes(), media_type=media, headers=headers)

    @page
    def case(request: Request, session: LabSession) -> Response:
        p = request.path_params
        try:
            trace = lab.reader.case(p["run_id"], p["case_id"], _repeat(p["repeat"]), session.caller.subject)
        except Unverified as exc:
            raise LabRefusal(409, "Run does not verify", str(exc)) from None
        except ValueError as exc:  # TraceError: the trace changed since it was verified
            raise LabRefusal(409, "Trace does not verify", lab.service.redact(str(exc))) from None
        return lab.render(request, "case.html", session=session, t=trace)

    @page
    def comparison(request: Request, session: LabSession) -> Response:
        incumbent = request.query_params.get("incumbent", "")
        challenger = request.query_params.get("challenger", "")
        runs = [r for r in lab.reader.runs() if r.status == "completed"]
        values = {"runs": runs, "incumbent": incumbent, "challenger": challenger, "result": None, "problem": None}
        if incumbent and challenger:
            try:
                pairing, result = lab.reader.comparison(incumbent, challenger)
            except (Unverified, ValueError) as exc:  # ValueError: PairingError, naming the rule
                values["problem"] = lab.service.redact(str(exc))
            else:
                a, b = lab.reader.run(incumbent), lab.reader.run(challenger)
                digests = (
                    lab.reader.corpus_digest(a.spec.body.bundle_id),
                    lab.reader.corpus_digest(b.spec.body.bundle_id),
                )
                qualities = (lab.reader.answer_quality(incumbent), lab.reader.answer_quality(challenger))
                values.update(result=result, pairing=pairing, digests=digests, qualities=qualities)
        return lab.render(request, "compare.html", session=session, **values)

    @page
    def corpora(request: Request, session: LabSession) -> Response:
        return lab.render(request, "corpora.html", session=session, revisions=lab.reader.revisions())

    @page
    def corpus(request: Request, session: LabSession) -> Response:
        return lab.render(request, "corpus.html", session=session, c=lab.reader.corpus(request.path_params["revision"]))

    async def not_found(request: Request, exc: HTTPException) -> Response:
        if exc.status_code == 405:
            return lab.render(
                request, "error.html", 405, title="Method not allowed", message=f"{request.method} is not allowed here"
            )
        return lab.render(request, "error.html", 404, title="Not found", message="no such page")

    routes = [
        Route("/", home),
        Route("/login", login_form, methods=["GET"]),
        Route("/login", login, methods=["POST"]),
        Route("/logout", logout, methods=["POST"]),
        Route("/static/{name}", static),
        Route("/runs", runs),
        Route("/runs/{run_id}", run),
        Route("/runs/{run_id}/ledger", ledger),
        Route("/runs/{run_id}/files/{path:path}", run_file),
        Route("/runs/{run_id}/cases/{case_id}/{repeat}", case),
        Route("/compare", comparison),
        Route("/corpus", corpora),
        Route("/corpus/{revision}", corpus),
    ]
    routes += review_routes(lab, page)
    app = Starlette(routes=routes, exception_handlers={HTTPException: not_found})
    app.state.lab = lab
    return app
