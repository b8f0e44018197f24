"""The change basis of a release, read from what binds it (``ragpipe.experiment.change``).

A release's basis is its bundle's stage spec IDs and default scope — read from the bundle's
manifest, whose semantic section the bundle ID hashes (``bundle_semantic_here``) — and the query
plan, answer plan and authorization policy IDs its manifest binds. The gate computes a
challenger's change from these; activation computes it again from the releases a decision names,
so a decision cannot claim to be a refresh it is not.
"""

from __future__ import annotations

from ragpipe.bundle.manifest import BundleSemantic
from ragpipe.bundle.objects import bundle_semantic_here
from ragpipe.bundle.verify import BundleVerificationError
from ragpipe.experiment.change import Change, ChangeBasis, classify
from ragpipe.kernel.workspace import Workspace
from ragpipe.release.manifest import ReleaseManifest, load_manifest
from ragpipe.release.store import ReleaseError, ReleaseStore


def basis_of(
    semantic: BundleSemantic, query_plan_id: str, answer_plan_id: str, authorization_policy_id: str
) -> ChangeBasis:
    """The basis of a bundle with this semantic section served under these plans and policy."""
    return ChangeBasis(
        stage_specs={stage: record.spec_id for stage, record in sorted(semantic.specs.items())},
        default_scope=semantic.default_scope,
        query_plan_id=query_plan_id,
        answer_plan_id=answer_plan_id,
        authorization_policy_id=authorization_policy_id,
    )


def release_basis(ws: Workspace, manifest: ReleaseManifest) -> ChangeBasis:
    """The basis of a published release; ``ReleaseError`` when its bundle's manifest cannot be read."""
    try:
        semantic = bundle_semantic_here(ws.bundles / manifest.bundle_hex, manifest.bundle_id)
    except BundleVerificationError as exc:
        raise ReleaseError(
            f"release {manifest.release_id}: bundle {manifest.bundle_id}: {'; '.join(exc.problems)}"
        ) from None
    return basis_of(semantic, manifest.query_plan_id, manifest.answer_plan_id, manifest.authorization_policy_id)


def change_against(ws: Workspace, challenger: ChangeBasis, incumbent_release: str | None) -> Change:
    """The change ``challenger`` is against the published release ``incumbent_release`` (None:
    bootstrap); ``ReleaseError`` when that release cannot be read."""
    if incumbent_release is None:
        return classify(challenger, None, None)
    incumbent = load_manifest(ReleaseStore(ws), incumbent_release)
    return classify(challenger, release_basis(ws, incumbent), incumbent_release)
