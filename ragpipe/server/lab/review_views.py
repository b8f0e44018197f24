"""The review pages of the lab (``review.py`` says what they read and write; docs/lab.md).

| route | what |
|---|---|
| ``GET /lab/review?at=N`` | the whole queue, item ``N``: pending cases of every dataset, then disputed answers |
| ``GET /lab/review/{dataset}?at=N`` | that dataset's pending cases, its counts and the freeze button |
| ``POST /lab/review/{dataset}/propose`` | JSON ``{csrf, case_id, decision, by, edited?}`` → ``{token, statement_b64}`` |
| ``POST /lab/review/decide`` | JSON ``{csrf, token, signature}`` → ``{recorded: {…}}`` |
| ``POST /lab/review/{dataset}/freeze`` | form ``csrf``: the next version (approvers from the target) |
| ``GET /lab/pairwise?a=&b=&case=&repeat=0``, ``POST /lab/pairwise`` | two runs' answers side by side; a choice |

The JSON routes answer ``{code, message}`` on refusal with a stable code: 401 ``unauthenticated``
(no session), 403 ``forbidden`` (missing or wrong CSRF token), 400 ``invalid_request``, 404
``not_found``, 403 ``not_an_approver``, 422 ``bad_signature``, 409 ``unknown_token``,
``expired_token``, ``stale_proposal`` (the case changed since the proposal), 422 ``refused`` (any
other rule of ``ragpipe.evaluation.datasets``, its one line). The server never signs.
"""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime

import anyio
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Route

from ragpipe.evaluation.datasets import DatasetError, StaleDecision, freeze, propose, record_decision
from ragpipe.kernel.signatures import verify
from ragpipe.server.errors import ApiError
from ragpipe.server.lab.forms import SECURITY_HEADERS, LabRefusal, posted_form
from ragpipe.server.lab.login import COOKIE, csrf_matches
from ragpipe.server.lab.readers import NotFound, Unverified
from ragpipe.server.lab.review import CHOICES, Proposals, ReviewReader, ReviewRefusal, edited_fields, record_choice

MAX_JSON_BYTES = 16384


def _at(request: Request) -> int:
    raw = request.query_params.get("at", "0")
    return int(raw) if raw.isascii() and raw.isdigit() and len(raw) < 7 else 0


def review_routes(lab, page) -> list[Route]:
    """The review routes over ``lab`` (``views.Lab``); ``page`` wraps a page handler as every lab page."""
    follower = lab.service.follower
    reader = ReviewReader(lab.service.ws.home, follower.target, getattr(follower, "targets_path", None))
    proposals = Proposals()
    lab.review, lab.proposals = reader, proposals  # tests reach the proposals' clock through the app state

    def refused(status: int, code: str, message: str) -> JSONResponse:
        return JSONResponse({"code": code, "message": message}, status_code=status, headers=SECURITY_HEADERS)

    def api(handler):
        """A JSON route: session (401), rate limit (429), bounded JSON body, CSRF (403), then
        ``handler(request, session, body)`` in a worker thread; refusals as ``{code, message}``."""

        async def endpoint(request: Request) -> Response:
            session = lab.sessions.get(request.cookies.get(COOKIE))
            if session is None:
                return refused(401, "unauthenticated", "log in to the lab first (a reviewer key)")
            try:
                lab.service.limit(session.caller.rate_key)
            except ApiError as limited:
                return JSONResponse(
                    {"code": limited.code, "message": limited.message},
                    status_code=429,
                    headers={**SECURITY_HEADERS, **(limited.headers or {})},
                )
            raw = await request.body()
            if request.headers.get("content-type", "").split(";")[0].strip() != "application/json":
                return refused(415, "invalid_request", "the body must be application/json")
            if len(raw) > MAX_JSON_BYTES:
                return refused(413, "invalid_request", f"a request may hold at most {MAX_JSON_BYTES} bytes")
            try:
                body = json.loads(raw)
            except ValueError:
                return refused(400, "invalid_request", "the body is not JSON")
            if not isinstance(body, dict):
                return refused(400, "invalid_request", "the body is a JSON object")
            csrf = body.get("csrf")
            if not isinstance(csrf, str) or not csrf_matches(session, csrf):
                return refused(403, "forbidden", "missing or wrong CSRF token")
            try:
                result = await anyio.to_thread.run_sync(handler, request, session, body)
            except ReviewRefusal as exc:
                return refused(exc.status, exc.code, lab.service.redact(exc.message))
            except DatasetError as exc:
                return refused(422, "refused", lab.service.redact(str(exc).splitlines()[0]))
            return JSONResponse(result, headers=SECURITY_HEADERS)

        return endpoint

    def _dataset(name: str):
        try:
            return reader.dataset(name)
        except LookupError:
            raise NotFound(f"no dataset {name!r}") from None
        except DatasetError as exc:
            raise LabRefusal(409, "Dataset does not verify", lab.service.redact(str(exc))) from None

    def _queue_page(request: Request, session, dataset: str | None, **extra) -> Response:
        state = counts = None
        if dataset is not None:
            state, counts = _dataset(dataset)
        try:
            items = reader.queue(dataset)
        except (DatasetError, ValueError) as exc:  # a dataset or trace log that does not verify
            raise LabRefusal(409, "Queue does not verify", lab.service.redact(str(exc).splitlines()[0])) from None
        at = min(_at(request), max(len(items) - 1, 0))
        item = items[at] if items else None
        sources = reader.sources(item.case, session.caller.subject) if item and item.kind == "case" else []
        return lab.render(
            request,
            "review.html",
            session=session,
            dataset=dataset,
            datasets=reader.datasets(),
            state=state,
            counts=counts,
            items=items,
            at=at,
            item=item,
            sources=sources,
            **extra,
        )

    @page
    def queue(request: Request, session) -> Response:
        return _queue_page(request, session, None)

    @page
    def dataset_queue(request: Request, session) -> Response:
        return _queue_page(request, session, request.path_params["dataset"])

    @api
    def propose_route(request: Request, session, body: dict) -> dict:
        name = request.path_params["dataset"]
        if name not in reader.datasets():
            raise ReviewRefusal(404, "not_found", f"no dataset {name!r}")
        case_id, decision, by = body.get("case_id"), body.get("decision"), body.get("by")
        if not all(isinstance(v, str) for v in (case_id, decision, by)):
            raise ReviewRefusal(400, "invalid_request", "case_id, decision and by are strings")
        state, _ = reader.dataset(name)
        approvers = reader.approvers(state.target)
        if by not in approvers:
            listed = ", ".join(sorted(approvers)) or "none"
            raise ReviewRefusal(
                403, "not_an_approver", f"{by!r} is not an approver of target {state.target!r} (approvers: {listed})"
            )
        entry = state.cases.get(case_id)
        if entry is None:
            raise ReviewRefusal(404, "not_found", f"dataset {name!r}: no case {case_id!r}")
        edited = None
        if decision == "edit":
            edited = edited_fields(entry.case, body.get("edited") or {})
        proposal = propose(lab.service.ws.home, name, case_id, decision, by, edited)
        statement = proposal.statement()
        return {
            "token": proposals.put(proposal, session.csrf),
            "statement_b64": base64.b64encode(statement).decode("ascii"),
            "statement": statement.decode("utf-8"),
        }

    @api
    def decide(request: Request, session, body: dict) -> dict:
        token, signature = body.get("token"), body.get("signature")
        if not isinstance(token, str) or not isinstance(signature, str):
            raise ReviewRefusal(400, "invalid_request", "token and signature are strings")
        proposal = proposals.take(token, session.csrf)
        state, _ = reader.dataset(proposal.dataset)
        approvers = reader.approvers(state.target)  # the target's approvers now
        key = approvers.get(proposal.by)
        if key is None:
            listed = ", ".join(sorted(approvers)) or "none"
            raise ReviewRefusal(
                403,
                "not_an_approver",
                f"{proposal.by!r} is not an approver of target {state.target!r} (approvers: {listed})",
            )
        if not verify(key, proposal.statement(), signature):
            raise ReviewRefusal(
                422,
                "bad_signature",
                f"decision on case {proposal.case_id!r} by {proposal.by!r}: the signature does not verify",
            )
        try:
            record = record_decision(lab.service.ws.home, proposal, signature, approvers)
        except DatasetError as exc:
            if isinstance(exc, StaleDecision):
                raise ReviewRefusal(409, "stale_proposal", str(exc)) from None
            raise
        return {
            "recorded": {
                "dataset": proposal.dataset,
                "case_id": proposal.case_id,
                "decision": proposal.decision,
                "by": proposal.by,
                "seq": record.seq,
            }
        }

    async def freeze_route(request: Request) -> Response:
        checked = await posted_form(lab, request)
        return checked if isinstance(checked, Response) else await frozen(request)

    @page
    def frozen(request: Request, session) -> Response:
        name = request.path_params["dataset"]
        state, _ = _dataset(name)
        try:
            version = freeze(lab.service.ws.home, name, reader.approvers(state.target))
        except ReviewRefusal as exc:
            raise LabRefusal(exc.status, "Cannot freeze", exc.message) from None
        except DatasetError as exc:
            return _queue_page(request, session, name, freeze_problem=lab.service.redact(str(exc).splitlines()[0]))
        split_counts: dict[str, int] = {}
        for split in version.splits.values():
            split_counts[split] = split_counts.get(split, 0) + 1
        return _queue_page(request, session, name, version=version, split_counts=dict(sorted(split_counts.items())))

    def _answers(run_id: str, case_id: str, repeat: int, session):
        try:
            return lab.reader.case(run_id, case_id, repeat, session.caller.subject)
        except Unverified as exc:
            raise LabRefusal(409, "Run does not verify", str(exc)) from None
        except ValueError as exc:
            raise LabRefusal(409, "Trace does not verify", lab.service.redact(str(exc))) from None

    def _pair_args(values) -> tuple[str, str, str, int]:
        a, b, case_id = values.get("a", ""), values.get("b", ""), values.get("case", "")
        raw = values.get("repeat", "0") or "0"
        if not (a and b and case_id):
            raise LabRefusal(400, "Missing parameters", "pairwise review needs a, b (run IDs) and case")
        if not (raw.isascii() and raw.isdigit()) or len(raw) > 6:
            raise NotFound(f"repeat {raw!r} is not a repeat number")
        return a, b, case_id, int(raw)

    @page
    def pairwise(request: Request, session) -> Response:
        a, b, case_id, repeat = _pair_args(request.query_params)
        left, right = _answers(a, case_id, repeat, session), _answers(b, case_id, repeat, session)
        return lab.render(
            request,
            "pairwise.html",
            session=session,
            a=left,
            b=right,
            case_id=case_id,
            repeat=repeat,
            recorded=request.query_params.get("recorded"),
        )

    async def choose(request: Request) -> Response:
        checked = await posted_form(lab, request)
        if isinstance(checked, Response):
            return checked
        request.state.form = checked[1]
        return await chosen(request)

    @page
    def chosen(request: Request, session) -> Response:
        form = request.state.form
        a, b, case_id, repeat = _pair_args(form)
        choice = CHOICES.get(form.get("choice", ""))
        if choice is None:
            raise LabRefusal(400, "Unknown choice", "choice is 1 (a), 2 (b) or 0 (tie)")
        _answers(a, case_id, repeat, session), _answers(b, case_id, repeat, session)  # both exist and verify
        at = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        record = record_choice(
            lab.service.ws.home,
            {"a": a, "b": b, "case_id": case_id, "repeat": repeat, "choice": choice, "by": session.principal, "at": at},
        )
        from urllib.parse import urlencode

        query = urlencode({"a": a, "b": b, "case": case_id, "repeat": repeat, "recorded": f"{choice} ({record.seq})"})
        base = request.scope.get("root_path", "")
        return RedirectResponse(f"{base}/pairwise?{query}", status_code=303, headers=SECURITY_HEADERS)

    return [
        Route("/review", queue, methods=["GET"]),
        Route("/review/decide", decide, methods=["POST"]),
        Route("/review/{dataset}", dataset_queue, methods=["GET"]),
        Route("/review/{dataset}/propose", propose_route, methods=["POST"]),
        Route("/review/{dataset}/freeze", freeze_route, methods=["POST"]),
        Route("/pairwise", pairwise, methods=["GET"]),
        Route("/pairwise", choose, methods=["POST"]),
    ]
