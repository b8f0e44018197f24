"""A sentence-transformers model folder on disk, pinned by the digest of the files it loads from.

The pinned set is every regular file under the folder, recursively, except what no loader reads:
files and folders whose name starts with ``.`` (``.gitattributes``, ``.git/``, a download
cache's ``.cache/``), Markdown files (``*.md``: model cards) and this module's own manifest
(``ragpipe-files.json``). So the weights (``*.safetensors``), the tokenizer (``tokenizer.json``,
``vocab.txt``, ``tokenizer_config.json``, ``special_tokens_map.json`` …), the model and
sentence-transformers configuration (``config.json``, ``modules.json``,
``sentence_bert_config.json``, ``config_sentence_transformers.json``) and every module folder
(``1_Pooling/config.json``, a ``2_Dense/`` layer …) are in it: anything that can change a vector.
A symbolic link is followed (a Hugging Face snapshot folder is made of links into its blob store);
anything that is neither a regular file nor a folder (a FIFO, a socket, a dangling link) is refused.

``files_sha256`` is ``content_id("model-files", 1, {"files": [{"path", "bytes", "sha256"}, …]})``:
the canonical list of (POSIX path relative to the folder, size, SHA-256), sorted by path. Loading
a folder recomputes the list and refuses it unless the digest is the pinned one. To name *which*
file differs, ``pin`` writes the list into the folder as ``ragpipe-files.json``: a refusal reads
that file, uses it only if its list recomputes to the pinned digest (so it cannot lie about the
pinned files, whoever wrote it), and names the first file that is missing, added or changed.
Without it (or with one of another pin) the refusal names the two digests and says how to compare.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from ragpipe.kernel.ids import content_id
from ragpipe.kernel.settings import current_settings

MANIFEST = "ragpipe-files.json"
MANIFEST_KIND = "ragpipe.model_files/v1"
ENV_MODEL_FOLDERS = "RAGPIPE_EMBEDDER_PATH"


class ModelFolderError(RuntimeError):
    """A model folder that cannot be used; ``str(e)`` is one line naming the folder, the file and the rule."""


@dataclass(frozen=True)
class FileEntry:
    path: str  # POSIX, relative to the folder
    bytes: int
    sha256: str

    def as_json(self) -> dict:
        return {"path": self.path, "bytes": self.bytes, "sha256": self.sha256}


def pinned(name: str) -> bool:
    """Whether a file or folder named ``name`` is in the pinned set (module docstring)."""
    return not (name.startswith(".") or name.lower().endswith(".md") or name == MANIFEST)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(1 << 22):
            h.update(block)
    return "sha256:" + h.hexdigest()


def folder_files(folder: Path) -> list[FileEntry]:
    """The pinned files of ``folder`` with their sizes and digests, sorted by path."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ModelFolderError(f"model folder {folder}: is not a folder")
    entries: list[FileEntry] = []

    def walk(directory: Path, prefix: str, depth: int) -> None:
        if depth > 16:
            raise ModelFolderError(f"model folder {folder}: {prefix} is nested too deep (a link cycle?)")
        for child in sorted(directory.iterdir(), key=lambda p: p.name):
            if not pinned(child.name):
                continue
            rel = prefix + child.name
            try:
                mode = child.stat().st_mode  # follows a link
            except OSError as exc:
                raise ModelFolderError(
                    f"model folder {folder}: {rel}: cannot be read ({exc.strerror or exc})"
                ) from None
            if stat.S_ISDIR(mode):
                walk(child, rel + "/", depth + 1)
            elif stat.S_ISREG(mode):
                try:
                    entries.append(FileEntry(rel, child.stat().st_size, _sha256(child)))
                except OSError as exc:
                    raise ModelFolderError(
                        f"model folder {folder}: {rel}: cannot be read ({exc.strerror or exc})"
                    ) from None
            else:
                raise ModelFolderError(f"model folder {folder}: {rel}: is not a regular file")

    walk(folder, "", 0)
    if not entries:
        raise ModelFolderError(f"model folder {folder}: holds no model files")
    return sorted(entries, key=lambda e: e.path)


def files_digest(entries: list[FileEntry]) -> str:
    """``files_sha256`` of a file list (module docstring)."""
    return content_id("model-files", 1, {"files": [e.as_json() for e in sorted(entries, key=lambda e: e.path)]})


def manifest_bytes(entries: list[FileEntry]) -> bytes:
    body = {"kind": MANIFEST_KIND, "files_sha256": files_digest(entries), "files": [e.as_json() for e in entries]}
    return json.dumps(body, indent=1, sort_keys=True).encode() + b"\n"


def pin(folder: Path, write_manifest: bool = True) -> tuple[str, list[FileEntry], Path | None]:
    """(``files_sha256``, the pinned files, the manifest written or None). The manifest is written
    atomically into the folder when ``write_manifest`` and the folder is writable."""
    folder = Path(folder)
    entries = folder_files(folder)
    written = None
    if write_manifest:
        target = folder / MANIFEST
        tmp = folder / f".{MANIFEST}.{os.getpid()}.tmp"
        try:
            tmp.write_bytes(manifest_bytes(entries))
            os.replace(tmp, target)
            written = target
        except OSError:
            tmp.unlink(missing_ok=True)
    return files_digest(entries), entries, written


def _recorded(folder: Path, pinned_digest: str) -> list[FileEntry] | None:
    """The folder's manifest list, if it is the list of ``pinned_digest`` (None otherwise)."""
    try:
        body = json.loads((folder / MANIFEST).read_bytes())
        entries = [FileEntry(str(f["path"]), int(f["bytes"]), str(f["sha256"])) for f in body["files"]]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return entries if files_digest(entries) == pinned_digest else None


def difference(recorded: list[FileEntry], actual: list[FileEntry]) -> str | None:
    """The first file (by path) that differs between two lists, as a phrase; None if equal."""
    was = {e.path: e for e in recorded}
    now = {e.path: e for e in actual}
    for path in sorted(set(was) | set(now)):
        if path not in now:
            return f"{path} is missing"
        if path not in was:
            return f"{path} is not one of the pinned files"
        if was[path] != now[path]:
            return f"{path} differs from the pinned file ({now[path].sha256}, {now[path].bytes} bytes; pinned {was[path].sha256})"
    return None


def verify(folder: Path, pinned_digest: str) -> Path:
    """``folder`` once its files' digest is ``pinned_digest``; ``ModelFolderError`` naming the first
    file that differs (module docstring) otherwise."""
    folder = Path(folder)
    actual = folder_files(folder)
    digest = files_digest(actual)
    if digest == pinned_digest:
        return folder
    recorded = _recorded(folder, pinned_digest)
    what = difference(recorded, actual) if recorded is not None else None
    if what is not None:
        raise ModelFolderError(f"model folder {folder}: {what}; the spec pins files_sha256 {pinned_digest}")
    raise ModelFolderError(
        f"model folder {folder}: its files have digest {digest}, but the spec pins files_sha256 {pinned_digest} "
        f"(no {MANIFEST} of the pinned files here to name the file that differs: compare with the folder "
        "the digest was pinned from, `ragpipe embedder pin PATH`)"
    )


def candidate_folders() -> list[Path]:
    """Folders named by ``$RAGPIPE_EMBEDDER_PATH`` (``os.pathsep``-separated): model folders, or
    folders holding model folders."""
    found: list[Path] = []
    for root in current_settings().embedder_path:
        found.append(root)
        if root.is_dir() and not (root / "modules.json").exists() and not (root / "config.json").exists():
            found += sorted(p for p in root.iterdir() if p.is_dir() and pinned(p.name))
    return found


def locate(pinned_digest: str, hints: list[Path]) -> Path:
    """The first of ``hints`` then ``$RAGPIPE_EMBEDDER_PATH``'s folders whose files have
    ``pinned_digest`` (a query-side embedder: a bundle names its model folder by digest only).
    ``ModelFolderError`` when none has."""
    tried: list[str] = []
    for folder in [*hints, *candidate_folders()]:
        if not Path(folder).is_dir():
            continue
        try:
            if files_digest(folder_files(Path(folder))) == pinned_digest:
                return Path(folder)
        except ModelFolderError:
            pass
        tried.append(str(folder))
    where = f" (tried {', '.join(tried)})" if tried else ""
    raise ModelFolderError(
        f"no model folder with files_sha256 {pinned_digest} found{where}: set {ENV_MODEL_FOLDERS} to the "
        "folder (or a folder holding it), or point the pipeline spec's embedder.model_path at it"
    )
