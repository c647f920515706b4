"""Two hooks.json files, one authority: the operator's and the workspace's.

The seed page discovers `.agents/hooks.json` in the workspace *or*
`/.agents/hooks.json`, the first one found used alone. In a sandbox the
workspace is the agent's to write, so `{}`, `"enabled": false` or invalid JSON
written there by a tool call the gate itself allowed would switch the gate off
for every later call. Here both files are loaded:

- the operator's (`/.agents/hooks.json`, mounted read-only) first: its groups
  run before any workspace group, whatever the workspace file says;
- the workspace's after it: it can only *add* groups. A group with the name of
  an operator group is ignored (logged as a problem), so it can neither replace
  nor disable nor shadow one; a workspace file that is invalid loses only its
  own groups;
- the same file reached by both paths (the workspace is `/`, or a symlink) is
  loaded once, as the operator's;
- the operator can say that workspace files add nothing: `"$settings":
  {"workspaceHooks": false}` in its file, or `--no-workspace-hooks`.

An operator file that cannot be read or parsed fails as the seed says (its
hooks do not run, the tool call goes ahead) but every problem line names the
layer, so the log shows that the operator's gate is what is missing.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, replace
from pathlib import Path

from egress.hooks import config as config_module
from egress.hooks.config import OPERATOR, WORKSPACE, HooksConfig, Settings, load_config


@dataclass(frozen=True)
class LoadedFile:
    """One file as it was read: enough to tell later whether it changed on disk."""

    layer: str
    path: str
    # (device, inode, size, mtime_ns), or None when there was no file.
    signature: tuple[int, int, int, int] | None
    config: HooksConfig | None  # None: no file (not a problem: the layer is empty)
    digest: str | None = None  # sha256 of the bytes read, None when none could be


def file_digest(path: str | Path) -> str | None:
    try:
        with open(path, "rb") as f:
            return hashlib.sha256(f.read(config_module.MAX_CONFIG_BYTES + 1)).hexdigest()
    except OSError:
        return None


@dataclass(frozen=True)
class LayeredConfig:
    """The merged configuration and the files it came from."""

    config: HooksConfig
    files: tuple[LoadedFile, ...]
    # (layer, source, problem) for every problem, the merge's own included.
    problems: tuple[tuple[str, str, str], ...]
    # (layer, source, text): worth a log line, but nothing to fix (`check` still passes).
    notes: tuple[tuple[str, str, str], ...] = ()


def file_signature(path: str | Path) -> tuple[int, int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def operator_default() -> Path:
    # Looked up at call time, so a test can point it elsewhere.
    return config_module.ROOT_CONFIG_PATH


def workspace_default(workspace: str | Path | None) -> Path:
    return Path(workspace if workspace is not None else ".") / config_module.CONFIG_RELATIVE_PATH


def load_layers(
    operator_path: str | Path | None = None,
    workspace_path: str | Path | None = None,
    *,
    workspace_hooks: bool = True,
) -> LayeredConfig:
    """Load the operator's file, then the workspace's, and merge them.

    `workspace_path` None: no workspace file is looked at (the caller passes
    `workspace_default(dir)` for the usual one). `workspace_hooks` False (the
    `--no-workspace-hooks` flag) has the same effect as the operator's setting.
    """
    operator = Path(operator_path) if operator_path is not None else operator_default()
    operator_file = _load(OPERATOR, operator)
    files = [operator_file]
    problems: list[tuple[str, str, str]] = []
    notes: list[tuple[str, str, str]] = []
    if operator_file.config is not None:
        problems += [(OPERATOR, str(operator), p) for p in operator_file.config.problems]
    settings = operator_file.config.settings if operator_file.config is not None else Settings()
    groups = list(operator_file.config.groups) if operator_file.config is not None else []

    workspace_wanted = workspace_hooks and settings.workspace_hooks is not False
    if workspace_path is not None and workspace_wanted and not _same_file(operator, workspace_path):
        workspace_file = _load(WORKSPACE, Path(workspace_path))
        files.append(workspace_file)
        if workspace_file.config is not None:
            source = str(workspace_path)
            problems += [(WORKSPACE, source, p) for p in workspace_file.config.problems]
            operator_names = {group.name for group in groups}
            for group in workspace_file.config.groups:
                if group.name in operator_names:
                    problems.append(
                        (
                            WORKSPACE,
                            source,
                            f"group {json.dumps(group.name)}: the operator's {operator} has a group of this name; "
                            "the workspace one is ignored (a workspace file can add groups, not replace, "
                            "disable or shadow the operator's)",
                        )
                    )
                    continue
                groups.append(group)
    elif workspace_path is not None and not workspace_wanted:
        why = "--no-workspace-hooks" if not workspace_hooks else f'"$settings": {{"workspaceHooks": false}} in {operator}'
        if Path(workspace_path).exists() and not _same_file(operator, workspace_path):
            notes.append((WORKSPACE, str(workspace_path), f"not loaded: {why}"))

    merged = HooksConfig(
        groups=tuple(groups),
        problems=tuple(problem for _, _, problem in problems),
        source=", ".join(f.path for f in files if f.config is not None) or None,
        settings=settings,
    )
    return LayeredConfig(config=merged, files=tuple(files), problems=tuple(problems), notes=tuple(notes))


def _load(layer: str, path: Path) -> LoadedFile:
    try:
        st = os.stat(path)
        signature: tuple[int, int, int, int] | None = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    except (FileNotFoundError, NotADirectoryError):
        if not os.path.islink(path):
            return LoadedFile(layer, str(path), None, None)
        signature = None  # a dangling symlink is a file that cannot be read, not no file
    except OSError:
        signature = None  # e.g. EACCES on the directory: load_config reports it
    digest = file_digest(path)
    config = load_config(path, settings_allowed=layer == OPERATOR)
    groups = tuple(replace(group, layer=layer, source=str(path)) for group in config.groups)
    return LoadedFile(layer, str(path), signature, replace(config, groups=groups), digest)


def _same_file(a: str | Path, b: str | Path) -> bool:
    """Both paths are one file (same device and inode, symlinks followed)."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)
