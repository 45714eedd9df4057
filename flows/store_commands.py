"""`tuneline verify` and `tuneline gc` (docs/ARCHITECTURE.md, "Artifacts, keys and runs").

Both cover two artifact stores of one layout: the workspace a pipeline ran in (`--workspace`, or
./workspace when it exists) and the tokenized-data cache that `tuneline train` and `data preview`
fill under `$TUNELINE_CACHE` (when it holds any). In the cache only tokenized artifacts are
considered, and gc keeps the `--keep-runs` most recently used of them. A workspace URL
(`--workspace s3://bucket/prefix`) is checked and cleaned in the object store itself.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tuneline.core.store.location import WorkspaceLocation
    from tuneline.core.store.remote import RemoteWorkspace

DEFAULT_WORKSPACE = "workspace"
CACHE_NAME = "tokenized-data cache"


@dataclass(frozen=True)
class Store:
    """One artifact store a command covers."""

    name: str  # "workspace" or CACHE_NAME, for the output
    root: Path | str  # a folder, or a workspace URL
    kinds: tuple[str, ...] | None  # the artifact kinds tuneline writes there (None: all)
    remote: RemoteWorkspace | None = None  # the workspace URL's objects


def run_verify(args: argparse.Namespace) -> int:
    from tuneline.core.store.verify import verify_remote, verify_workspace

    any_damaged = False
    for store in covered_stores(args):
        verdicts = (verify_remote(store.remote, kinds=store.kinds) if store.remote is not None
                    else verify_workspace(store.root, kinds=store.kinds))
        for verdict in verdicts:
            if verdict.damaged:
                print(f"damaged: {verdict.path}")
                for problem in verdict.problems:
                    print(f"  {problem}")
        damaged = sum(v.damaged for v in verdicts)
        unchecked = sum(not v.checked for v in verdicts)
        print(f"{store.name} {store.root}: {len(verdicts)} artifact(s) verified, {damaged} damaged"
              + (f", {unchecked} without file hashes (written by an older tuneline; not checked)" if unchecked else ""))
        any_damaged = any_damaged or damaged > 0
    if any_damaged:
        print("the damaged artifacts are marked (manifest.json gave way to damage.json): the next run recomputes them")
    return 1 if any_damaged else 0


def run_gc(args: argparse.Namespace) -> int:
    from tuneline.core.store.gc import find_garbage, find_remote_garbage, remove_garbage, remove_remote_garbage

    if args.keep_runs < 0:
        from tuneline.core.errors import ConfigError

        raise ConfigError(f"--keep-runs {args.keep_runs}: give a count of runs, 0 or more.", source="tuneline gc")
    stores = covered_stores(args)
    found = []
    for store in stores:  # every store's references are read before anything is listed
        referenced, unreferenced = _kept_keys(store, args)
        if store.remote is not None:
            items = find_remote_garbage(store.remote, referenced=referenced, kinds=store.kinds, unreferenced=unreferenced)
        else:
            items = find_garbage(store.root, referenced=referenced, kinds=store.kinds, unreferenced=unreferenced)
        found.append((store, items))
    garbage = [item for _, items in found for item in items]
    for item in garbage:
        kept = "; kept while a process reads it" if item.in_use else ""
        print(f"{_size_text(item.size):>10}  {item.path}  ({item.reason}{kept})")
    total = _size_text(sum(item.size for item in garbage))
    in_use = sum(item.in_use for item in garbage)
    read_now = f", {in_use} of them in use by a process that reads them (kept until it stops)" if in_use else ""
    if not args.yes:
        print(f"{len(garbage)} unreferenced folder(s), {total}{read_now}"
              + ("; run again with --yes to remove them" if len(garbage) > in_use else ""))
        return 0
    removed = [item for store, items in found
               for item in (remove_remote_garbage(store.remote, items) if store.remote is not None else remove_garbage(store.root, items))]
    print(f"removed {len(removed)} folder(s), {_size_text(sum(item.size for item in removed))}"
          + (f"; {len(garbage) - len(removed)} kept: in use by a process that reads them, or taken by a running "
             "process meanwhile" if len(removed) < len(garbage) else ""))
    return 0


def _kept_keys(store: Store, args: argparse.Namespace) -> tuple[set[str], str]:
    """The keys gc keeps in `store`, and why an artifact outside them goes."""
    if store.name == CACHE_NAME:
        from tuneline.core.pipeline.stage_runs import TOKENIZED_KIND
        from tuneline.core.store.recency import recently_used

        return (recently_used(store.root, TOKENIZED_KIND, count=args.keep_runs),
                f"tokenized data not among the {args.keep_runs} most recently used")
    from tuneline.core.store.gc import UNREFERENCED
    from tuneline.core.tracking.references import referenced_keys

    return referenced_keys(_workspace_store(store, args), keep_runs=args.keep_runs), UNREFERENCED


def covered_stores(args: argparse.Namespace) -> list[Store]:
    """The workspace (`--workspace`, which must exist; else ./workspace if it exists) and the
    tokenized-data cache (if it holds artifacts); at least one of them, else a ConfigError."""
    from tuneline.core.config import cache_root
    from tuneline.core.errors import ConfigError
    from tuneline.core.pipeline.stage_runs import TOKENIZED_KIND
    from tuneline.core.store.location import parse_workspace

    location = parse_workspace(args.workspace or DEFAULT_WORKSPACE, source=f"tuneline {args.command} --workspace")
    if location.is_remote:
        return [_remote_store(location, args)]
    workspace = Path(args.workspace or DEFAULT_WORKSPACE)
    has_workspace = (workspace / "artifacts").is_dir()
    if args.workspace and not has_workspace:
        raise ConfigError(f"--workspace {args.workspace}: no artifacts/ folder in {workspace.resolve()}; pass the workspace a "
                          f"pipeline ran in (--workspace DIR).", source=f"tuneline {args.command}")
    stores = [Store("workspace", workspace, None)] if has_workspace else []
    cache = cache_root()
    if (cache / "artifacts").is_dir() and not (has_workspace and cache.resolve() == workspace.resolve()):
        stores.append(Store(CACHE_NAME, cache, (TOKENIZED_KIND,)))
    if not stores:
        raise ConfigError(f"no artifacts/ folder in {workspace.resolve()} (the default workspace) nor in the {CACHE_NAME} "
                          f"{cache} ($TUNELINE_CACHE); pass the workspace a pipeline ran in (--workspace DIR).",
                          source=f"tuneline {args.command}")
    return stores


def _remote_store(location: WorkspaceLocation, args: argparse.Namespace) -> Store:
    """The URL workspace, which must hold artifacts/ (one request). Its fetched copies in
    $TUNELINE_CACHE are a cache of it, not a store of their own."""
    from tuneline.core.errors import ConfigError
    from tuneline.core.store.remote import RemoteWorkspace

    remote = RemoteWorkspace(location)
    url = location.artifacts_url()
    if not remote.attempt("listing", url, lambda: remote.filesystem.exists(url)):
        raise ConfigError(f"--workspace {location.url}: nothing under {url}/; pass the workspace URL a pipeline ran in.",
                          source=f"tuneline {args.command}")
    return Store("workspace", location.url, None, remote=remote)


def _workspace_store(store: Store, args: argparse.Namespace) -> str:
    """MLFLOW_TRACKING_URI, else the workspace's SQLite store, which must exist: without it gc cannot
    tell what recent runs use (and opening a missing one would create an empty store). A URL
    workspace has no SQLite store: its runs went to the tracking server MLFLOW_TRACKING_URI names."""
    from tuneline.core.errors import ConfigError
    from tuneline.core.tracking import runs as tracking

    if store.remote is not None:
        if not os.environ.get("MLFLOW_TRACKING_URI"):
            raise ConfigError(f"--workspace {store.root}: gc needs the MLflow tracking server its runs went to, to tell "
                              f"which artifacts recent runs and registered models use; set MLFLOW_TRACKING_URI to it.",
                              source=f"tuneline {args.command}")
        return os.environ["MLFLOW_TRACKING_URI"]
    workspace = Path(store.root)

    store = workspace / "mlflow.db"
    if not os.environ.get("MLFLOW_TRACKING_URI") and not store.is_file():
        raise ConfigError(f"--workspace {workspace}: no MLflow store at {store.resolve()}, so gc cannot tell which "
                          f"artifacts recent runs use; pass the workspace a pipeline ran in, or set MLFLOW_TRACKING_URI to "
                          f"the store its runs went to.", source=f"tuneline {args.command}")
    return tracking.tracking_uri(str(workspace))


def _size_text(size: int) -> str:
    if size < 1024:
        return f"{size} B"
    for unit in ("KB", "MB", "GB", "TB"):
        size /= 1024
        if size < 1024 or unit == "TB":
            break
    return f"{size:.1f} {unit}"
