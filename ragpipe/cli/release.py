"""``ragpipe release …`` (typer app ``release_app``).

    ragpipe release list [--json]
    ragpipe release show RELEASE_ID [--json]
    ragpipe release current [--target T] [--json]
    ragpipe release approve RELEASE_ID --target T --by NAME [--note TEXT] [--json]
    ragpipe release activate (RELEASE_ID | --revision KEY) [--target T] [--json]
    ragpipe release rollback [--target T] [--to RELEASE_ID] [--json]
    ragpipe release accept-time --target T --record N --by NAME --reason TEXT [--key KEYFILE] [--json]

A RELEASE_ID is the full ID or a unique prefix of at least 12 hex digits (``sha256:`` optional).
Every expected error prints ``error: <message>`` on stderr and exits 1; ``--json`` prints exactly
one JSON value on stdout. Targets come from ``ragpipe/specs/targets.yaml`` (or ``$RAGPIPE_TARGETS``);
without ``--target`` the configured default target is used.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.markup import escape
from rich.table import Table

from ragpipe.cli.common import JsonOpt, emit_json, err, fail, out

release_app = typer.Typer(
    help="Release manifests, targets, approvals, activation and rollback.", no_args_is_help=True, add_completion=False
)
T = TypeVar("T")

TargetOpt = Annotated[
    str | None, typer.Option("--target", "-t", help="Target (default: the configured default target).")
]
ReleaseArg = Annotated[
    str,
    typer.Argument(
        metavar="RELEASE_ID", help="Release ID (sha256:<64 hex>) or a unique prefix of at least 12 hex digits."
    ),
]


def guarded(action: Callable[[], T]) -> T:
    """Run ``action``; the errors bad input or a lost race can cause become one message, exit 1."""
    from ragpipe.kernel.ledger import LedgerError
    from ragpipe.kernel.seals import SealKeyError
    from ragpipe.release.store import ReleaseError

    try:
        return action()
    except (ReleaseError, LedgerError, SealKeyError, OSError) as exc:
        fail(str(exc))


def _ws():
    from ragpipe.kernel.workspace import Workspace, default_home

    return Workspace(default_home())


def short_ids(release_ids: list[str], width: int = 16) -> dict[str, str]:
    """Each ID as ``sha256:`` + its shortest prefix of at least ``width`` hex digits unique among
    them: what ``activate``, ``show``, ``approve`` and ``rollback --to`` take (12 at least)."""
    while len({rid[7 : 7 + width] for rid in release_ids}) < len(set(release_ids)):
        width += 4
    return {rid: rid[: 7 + width] for rid in release_ids}


def full_id(ws, text: str) -> str:
    """The release ID ``text`` names (the ID, or a unique prefix of at least 12 hex digits)."""
    from ragpipe.release.manifest import resolve_release_id
    from ragpipe.release.store import ReleaseStore

    return resolve_release_id(ReleaseStore(ws), text)


def revision_release(ws, revision: str) -> str:
    """The release of ``revision``'s latest build (its ``release_manifest`` stage output)."""
    from ragpipe.release.store import ReleaseError
    from ragpipe.stages.stage_store import StageError, read_output

    try:
        return str(read_output(ws, revision, "release_manifest").record.facts["release_id"])
    except StageError as exc:
        raise ReleaseError(
            f"revision {revision!r} has no release ({exc}): build it with ragpipe build under a spec with an evaluation: section"
        ) from None


@release_app.command("list")
def release_list(as_json: JsonOpt = False) -> None:
    """Every published release with its gate outcome and the targets it is active on."""
    from ragpipe.release.status import release_summaries

    everything = guarded(lambda: release_summaries(_ws()))
    if as_json:
        emit_json(everything)
        return
    rows = [r for r in everything if "invalid" not in r]
    for bad in (r for r in everything if "invalid" in r):  # listed, never hiding the valid ones
        err.print(f"invalid manifest: {escape(str(bad['invalid']))}", soft_wrap=True)
    if not rows:
        out.print("no releases")
        return
    names = {(r.get("metric") or {}).get("name") for r in rows}
    one_metric = next(iter(names)) if len(names) == 1 and None not in names else None
    # 80 columns hold it: collapsed padding, and the reasons of ineligible releases under the table
    table = Table(title=f"{len(rows)} releases", box=None, collapse_padding=True, pad_edge=False, header_style="bold")
    for col, width in (("release", 12), ("published", 11), ("revision", 9), ("change", 10)):
        table.add_column(col, no_wrap=col != "revision", overflow="fold", min_width=width)
    table.add_column(f"{one_metric} (Δ)" if one_metric else "metric", overflow="fold", min_width=14)
    table.add_column("eligible", no_wrap=True)
    table.add_column("live on", overflow="fold", min_width=7)
    shown = short_ids([str(r["release_id"]) for r in rows], width=12)
    notes: list[str] = []  # why each ineligible release is not eligible, one line each under the table
    for r in rows:
        short = shown[str(r["release_id"])].removeprefix("sha256:")  # what activate takes, without the prefix
        if not r["eligible"]:
            notes.append(
                f"({len(notes) + 1}) {short}: {r['first_reason'] or 'decisive phase ' + str(r['decisive_phase'])}"
            )
        table.add_row(
            short,
            published_cell(r["published"]),
            escape(str(r["revision"])),
            str(r["change"] or "unknown"),
            metric_cell(r, named=one_metric is None),
            "yes" if r["eligible"] else f"no ({len(notes)})",
            ", ".join(r["active_targets"]) or "—",
        )  # type: ignore[arg-type]
    out.print(table, soft_wrap=True)
    for note in notes:
        out.print(escape(note), soft_wrap=True)


def published_cell(published: object) -> str:
    """``12-07 00:52`` (UTC, to the minute; the JSON has the date and seconds); ``—`` when unknown."""
    return "—" if not published else str(published)[5:16].replace("T", " ")


def metric_cell(row: dict[str, Any], *, named: bool = True) -> str:
    """``0.7123 +0.0012`` (value, then the paired delta), ``0.7 —`` without an incumbent,
    prefixed by the metric's name when ``named``; or why the figures are unknown."""
    m = row.get("metric")
    if not m:
        return escape(f"unknown: {row.get('evidence')}")
    value = "no value" if m["value"] is None else f"{m['value']:.4g}"
    if not m["paired"]:
        delta = "—"
    else:
        delta = "(no scored case)" if m["delta"] is None else f"{m['delta']:+.3g}"
    return f"{m['name']} {value} {delta}" if named else f"{value} {delta}"


@release_app.command("show")
def release_show(release_id: ReleaseArg, as_json: JsonOpt = False) -> None:
    """A release's manifest and its state on every target."""
    from ragpipe.release.manifest import load_manifest
    from ragpipe.release.status import target_states
    from ragpipe.release.store import ReleaseStore

    def run() -> dict[str, Any]:
        ws = _ws()
        full = full_id(ws, release_id)
        manifest = load_manifest(ReleaseStore(ws), full)
        targets = {}
        for name, state in target_states(ws).items():
            approvals = [{"by": a.by, "at": a.at, "note": a.note} for a in state.approvals.get(full, ())]
            targets[name] = {"state": state.states.get(full, "awaiting activation"), "approvals": approvals}
        return {"release_id": full, "manifest": manifest.body(), "targets": targets}

    data = guarded(run)
    if as_json:
        emit_json(data)
        return
    m = data["manifest"]
    out.print(f"[bold]release {data['release_id']}[/]", soft_wrap=True)
    for key in (
        "revision",
        "bundle_id",
        "material_digest",
        "query_plan_id",
        "answer_plan_id",
        "authorization_policy_id",
        "gate_policy_id",
        "comparison_id",
    ):
        out.print(f"  {key}: {escape(str(m[key]))}", soft_wrap=True)
    out.print(
        f"  evaluation: spec {m['evaluation']['spec_id']} run {escape(m['evaluation']['run_id'])} head {m['evaluation']['ledger_head']}",
        soft_wrap=True,
    )
    out.print(
        f"  gate: decision {m['gate']['decision_id']} eligible {m['gate']['eligible']} decisive phase {m['gate']['decisive_phase']}",
        soft_wrap=True,
    )
    for name, t in data["targets"].items():
        out.print(
            f"  {name}: {t['state']}" + "".join(f"; approved by {escape(a['by'])} at {a['at']}" for a in t["approvals"])
        )


@release_app.command("current")
def release_current(target: TargetOpt = None, as_json: JsonOpt = False) -> None:
    """The release live on a target: checked as serving checks it (pointer and history agreeing,
    eligible and approved as activation required, verified), else exit 1 naming why."""
    from ragpipe.release.live import live_release
    from ragpipe.release.pointer import read_pointer
    from ragpipe.release.store import ReleaseStore
    from ragpipe.release.targets import load_targets

    def run() -> dict[str, Any]:
        config = load_targets()
        name, _ = config.get(target)
        if read_pointer(ReleaseStore(_ws()), name) is None:
            return {
                "target": name,
                "release_id": None,
                "generation": 0,
                "previous": None,
                "since": None,
                "action": None,
            }
        live = live_release(_ws(), name, config=config, defer_vector_table=True)
        return {
            "target": name,
            "release_id": live.release_id,
            "generation": live.generation,
            "previous": live.previous,
            "since": live.since,
            "action": live.action,
        }

    data = guarded(run)
    if as_json:
        emit_json(data)
    elif data["release_id"] is None:
        out.print(f"{data['target']}: no active release")
    else:
        out.print(
            f"{data['target']}: {data['release_id']} (generation {data['generation']}, "
            f"{data['action']} at {data['since']})",
            soft_wrap=True,
        )


@release_app.command("approve")
def release_approve(
    release_id: ReleaseArg,
    target: Annotated[str, typer.Option("--target", "-t", help="Target the approval is for.")],
    by: Annotated[str, typer.Option("--by", help="The approver, as the target's approvers list names them.")],
    key: Annotated[Path, typer.Option("--key", help="The approver's private key file (ragpipe release approver-key).")],
    note: Annotated[str, typer.Option("--note", help="Free text recorded with the approval.")] = "",
    days: Annotated[int, typer.Option("--days", help="Days the approval stays valid (1-90).")] = 7,
    as_json: JsonOpt = False,
) -> None:
    """Sign and record an approver's approval of a release for a target."""
    from ragpipe.release.approvals import approve

    ws = _ws()
    a = guarded(lambda: approve(ws, full_id(ws, release_id), target, by=by, key_file=key, note=note, days=days))
    data = {
        "release_id": a.release_id,
        "target": target,
        "by": a.by,
        "at": a.at,
        "expires": a.expires,
        "note": a.note,
        "record": a.seq,
    }
    if as_json:
        emit_json(data)
    else:
        out.print(
            f"approved {a.release_id} for {target} by {escape(a.by)} until {a.expires} (history record {a.seq})",
            soft_wrap=True,
        )


@release_app.command("approver-key")
def release_approver_key(
    name: Annotated[str, typer.Argument(help="The approver's name, as the targets config will list it.")],
    out_file: Annotated[Path, typer.Option("--out", help="Where to write the private key (created, mode 0600).")],
) -> None:
    """Make an approver's Ed25519 key pair: the private key file, and the line for the targets config."""
    from ragpipe.kernel.signatures import KeyFileError, new_key_file
    from ragpipe.release.store import ReleaseError
    from ragpipe.release.targets import APPROVER_NAME

    def run() -> str:
        if not APPROVER_NAME.match(name):
            raise ReleaseError(
                f"approver {name!r}: a name is 1-64 of a-z 0-9 . _ @ - (starting with a letter or digit)"
            )
        try:
            return new_key_file(out_file)
        except KeyFileError as exc:
            raise ReleaseError(str(exc)) from None

    public = guarded(run)
    out.print(f"private key written to {out_file}; add under the target's approvers: in the targets config:")
    out.print(f'  {name}: "{public}"', soft_wrap=True)


@release_app.command("activate")
def release_activate(
    release_id: Annotated[
        str | None,
        typer.Argument(
            metavar="[RELEASE_ID]",
            help="Release ID or a unique prefix of at least 12 hex digits (or give --revision).",
        ),
    ] = None,
    target: TargetOpt = None,
    revision: Annotated[
        str | None, typer.Option("--revision", "-r", help="Activate the release of this revision's latest build.")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Activate a release (refused unless eligible, verified, and approved where required)."""
    from ragpipe.release.activation import activate
    from ragpipe.release.store import ReleaseError

    def chosen(ws) -> str:
        if (release_id is None) == (revision is None):
            raise ReleaseError("give a release ID or --revision KEY (one of them)")
        return full_id(ws, release_id) if release_id is not None else revision_release(ws, revision)  # type: ignore[arg-type]

    ws = _ws()
    result = guarded(lambda: activate(ws, chosen(ws), target))
    if as_json:
        emit_json(result.as_dict())
    elif result.changed:
        out.print(
            f"activated {result.release_id} on {result.target} (generation {result.generation}; previous {result.previous or 'none'})",
            soft_wrap=True,
        )
    else:
        out.print(
            f"{result.release_id} is already active on {result.target} (generation {result.generation}); nothing changed",
            soft_wrap=True,
        )


@release_app.command("rollback")
def release_rollback(
    target: TargetOpt = None,
    to: Annotated[
        str | None,
        typer.Option("--to", help="A previously active release to return to (ID or unique prefix of 12+ hex digits)."),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Point a target back to a previously active, still-verifying release (no rebuild)."""
    from ragpipe.release.rollback import rollback

    ws = _ws()
    result = guarded(lambda: rollback(ws, target, to=None if to is None else full_id(ws, to)))
    if as_json:
        emit_json(result.as_dict())
    else:
        out.print(
            f"rolled back {result.target} to {result.release_id} (generation {result.generation}; previous {result.previous})",
            soft_wrap=True,
        )


@release_app.command("accept-time")
def release_accept_time(
    target: Annotated[str, typer.Option("--target", "-t", help="The target whose history holds the record.")],
    record: Annotated[int, typer.Option("--record", help="The history record dated before the record before it.")],
    by: Annotated[
        str, typer.Option("--by", help="Who accepts its time (an approver where the target requires approvals).")
    ],
    reason: Annotated[
        str, typer.Option("--reason", help="What was wrong (e.g. the clock of the machine that wrote it).")
    ],
    key: Annotated[
        Path | None, typer.Option("--key", help="The approver's private key file, where the target requires approvals.")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Accept the time of a history record dated before its predecessor (a clock was behind), so the
    target serves again; nothing is rewritten (docs/releases.md, Time order)."""
    from ragpipe.release.time_order import accept_time

    c = guarded(lambda: accept_time(_ws(), target, record, by=by, reason=reason, key_file=key))
    data = {"target": target, "record": c.record.seq, "dated": c.record.at, "by": c.by, "at": c.at, "correction": c.seq}
    if as_json:
        emit_json(data)
    else:
        out.print(
            f"accepted the time {c.record.at} of history record {c.record.seq} of {target} "
            f"(by {escape(c.by)}; correction record {c.seq})",
            soft_wrap=True,
        )
