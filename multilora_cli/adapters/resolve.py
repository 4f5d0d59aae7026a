"""Turn what a user typed (`./legal`, `~/loras/x`, `org/name@rev`) into a local directory.

Order (vLLM's): absolute path; `~` expansion; an existing relative path; else a Hugging Face Hub repo id
fetched with `snapshot_download`, limited to the files multilora reads. Hub settings are read from the
environment at call time (HF_HUB_OFFLINE, HF_HUB_CACHE, HF_HOME, HF_ENDPOINT, HF_TOKEN), so a process that
changes them after importing huggingface_hub still gets what it asked for.
"""

from __future__ import annotations

import os
from pathlib import Path

from multilora_cli.errors import ResolveError
from multilora_cli.paths import expand_user

ADAPTER_PATTERNS = ["adapter_config.json", "adapter_model.safetensors", "adapter_model.bin", "README.md"]
MODEL_PATTERNS = [
    "config.json",
    "*.safetensors",
    "model.safetensors.index.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "generation_config.json",
    "chat_template.jinja",
    "special_tokens_map.json",
]
# A file the user pointed at instead of its folder: we take the folder.
_KNOWN_FILES = {"adapter_config.json", "adapter_model.safetensors", "adapter_model.bin", "config.json"}
_TRUE = {"1", "true", "yes", "on"}


def looks_like_path(spec: str) -> bool:
    """True when `spec` cannot be a Hub id and must be a local path (so a miss is a missing path)."""
    if spec in (".", "..") or spec.startswith(("/", "./", "../", "~", ".\\", "..\\")) or "\\" in spec:
        return True
    if spec.endswith("/") or spec.count("/") > 1:
        return True
    head = spec.split("/", 1)[0]
    return "/" in spec and Path(head).exists()  # "adapters/legal" where ./adapters exists


def hub_offline() -> bool:
    """HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE) as set now, or as huggingface_hub read it at import."""
    env = (os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or "").strip().lower()
    if env:
        return env in _TRUE
    try:
        from huggingface_hub import constants
    except ImportError:  # pragma: no cover - a declared dependency
        return False
    return bool(constants.HF_HUB_OFFLINE)


def hub_cache_dir() -> str | None:
    """HF_HUB_CACHE, else $HF_HOME/hub, else None (huggingface_hub's default)."""
    if os.environ.get("HF_HUB_CACHE"):
        return os.path.expanduser(os.environ["HF_HUB_CACHE"])
    if os.environ.get("HF_HOME"):
        return os.path.join(os.path.expanduser(os.environ["HF_HOME"]), "hub")
    return None


def resolve(
    spec: str,
    *,
    kind: str = "adapter",
    allow_patterns: list[str] | None = None,
    cache_dir: str | None = None,
    local_files_only: bool | None = None,
    name: str | None = None,
) -> Path:
    """Resolve a local path or Hub id (`org/name`, `org/name@revision`) to a local directory.

    kind: "adapter" (fetch adapter files only) or "model" (config, weights, tokenizer files).
    local_files_only: None = follow HF_HUB_OFFLINE. name: the adapter's name, when it differs from `spec`.
    Raises ResolveError naming the adapter / model and what to do.
    """
    if kind not in ("adapter", "model"):
        raise ValueError(f"kind must be 'adapter' or 'model', got {kind!r}")
    spec = (spec or "").strip()
    label = f"{kind} {name!r} ({spec})" if name and name != spec else f"{kind} {spec!r}"
    if not spec:
        raise ResolveError(f"{label}: empty path or id", hint="give a directory or a Hugging Face Hub id")
    path = expand_user(spec) if spec.startswith("~") else Path(spec)
    if path.exists():
        return _as_dir(path, label, kind)
    if path.is_absolute() or looks_like_path(spec):
        raise ResolveError(
            f"{label}: path {str(path)!r} does not exist",
            hint="check the path, or pass a Hugging Face Hub id like org/name",
        )
    repo_id, _, revision = spec.partition("@")
    try:
        from huggingface_hub.utils import validate_repo_id

        validate_repo_id(repo_id)
    except Exception:  # noqa: BLE001 - HFValidationError; anything else means "not an id" too
        raise ResolveError(
            f"{label} is neither an existing path nor a valid Hugging Face Hub id",
            hint="pass a directory, or an id like org/name (optionally org/name@revision)",
        ) from None
    patterns = (
        allow_patterns if allow_patterns is not None else (ADAPTER_PATTERNS if kind == "adapter" else MODEL_PATTERNS)
    )
    offline = hub_offline() if local_files_only is None else bool(local_files_only)
    try:
        return _download(label, repo_id, revision or None, patterns, cache_dir or hub_cache_dir(), offline)
    except ResolveError as e:
        if "/" in repo_id:  # org/name reads as a Hub id first, but it may be a mistyped folder too: say both
            if isinstance(e, _RepoFound):
                raise
            raise ResolveError(
                f"{e.message}; there is no local folder {spec!r} in {Path.cwd()} either",
                hint=f"{e.hint}; for a local folder, check its name and the current directory",
            ) from None
        # A bare word ("legal") is far more often a mistyped local folder than a Hub id: say that first.
        why = e.message.removeprefix(label).lstrip(": ")
        why = f"it {why}" if why.startswith("is ") else why
        raise ResolveError(
            f"{label}: there is no folder {spec!r} in {Path.cwd()}; as a Hugging Face Hub id, {why}",
            hint="check the folder name and the current directory, or give a Hub id like org/name",
        ) from None


class _RepoFound(ResolveError):
    """The Hub has the repo (gated, or no such revision): the spec was a Hub id, not a mistyped folder."""


def _as_dir(path: Path, label: str, kind: str) -> Path:
    if path.is_file():
        if path.name in _KNOWN_FILES:
            return path.parent.resolve()
        raise ResolveError(
            f"{label} is a file; expected a directory",
            hint=f"point at the folder holding {'adapter_config.json' if kind == 'adapter' else 'config.json'}",
        )
    return path.resolve()


def _download(
    label: str, repo_id: str, revision: str | None, patterns: list[str], cache_dir: str | None, offline: bool
) -> Path:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    where = cache_dir or "the Hugging Face cache"
    try:
        folder = snapshot_download(
            repo_id,
            revision=revision,
            cache_dir=cache_dir,
            local_files_only=offline,
            allow_patterns=patterns,
            endpoint=os.environ.get("HF_ENDPOINT") or None,
            token=os.environ.get("HF_TOKEN") or None,
        )
    except GatedRepoError:
        raise _RepoFound(
            f"{label}: Hugging Face Hub repo {repo_id!r} is gated and this account has no access",
            hint=f"accept its terms at https://huggingface.co/{repo_id} and set HF_TOKEN to a token of that account",
        ) from None
    except RepositoryNotFoundError:
        raise ResolveError(
            f"{label}: Hugging Face Hub repo {repo_id!r} does not exist or is private",
            hint="check the id (and the local path, if you meant one); for a private repo set HF_TOKEN",
        ) from None
    except RevisionNotFoundError:
        raise _RepoFound(
            f"{label}: revision {revision!r} does not exist in Hugging Face Hub repo {repo_id!r}",
            hint="use a branch, tag or commit of that repo after '@'",
        ) from None
    except LocalEntryNotFoundError as e:
        if offline:
            raise ResolveError(
                f"{label} is not in {where} and Hub downloads are off (HF_HUB_OFFLINE)",
                hint=f"download it while online (hf download {repo_id}{f' --revision {revision}' if revision else ''})"
                " or unset HF_HUB_OFFLINE",
            ) from None
        raise ResolveError(
            f"{label}: cannot reach the Hugging Face Hub and it is not in {where} ({_first_line(e)})",
            hint="check the network (or HF_ENDPOINT), or pass a local path",
        ) from None
    except HfHubHTTPError as e:
        raise ResolveError(
            f"{label}: Hugging Face Hub error: {_first_line(e)}", hint="retry later, or pass a local path"
        ) from None
    except (OSError, ValueError) as e:
        raise ResolveError(
            f"{label}: download failed: {_first_line(e)}", hint="check the network and disk space, or pass a local path"
        ) from None
    return Path(folder)


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
