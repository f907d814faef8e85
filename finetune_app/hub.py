"""Talking to the Hugging Face Hub: token, pre-flight checks and pushing an export folder.

Everything goes through the real `huggingface_hub` client. The endpoint is read from ``HF_ENDPOINT`` at
call time (huggingface_hub itself reads it once at import), so tests and private Hub mirrors can set it
whenever they like. The token is only ever handed to `HfApi`; it is never printed, logged or written.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEFAULT_ENDPOINT = "https://huggingface.co"
# Org roles that may create repos in the org (contributors can create, write/admin can also overwrite).
WRITING_ORG_ROLES = ("admin", "write", "contributor")
# Stale weights from an earlier push would contradict the new model card, so a push replaces them.
REPLACED_ON_PUSH = ["*.safetensors", "*.safetensors.index.json", "*.bin", "*.png"]

Progress = Callable[[str], None] | None


class PushError(RuntimeError):
    """A push that cannot or did not happen; the message says why and what to do."""


@dataclass(frozen=True)
class PushTarget:
    """What the pre-flight check learned: who we are and whether the repo already exists."""

    repo_id: str
    user: str
    exists: bool
    private: bool


def hub_endpoint() -> str:
    return (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def hub_api(token: str):
    from huggingface_hub import HfApi

    return HfApi(endpoint=hub_endpoint(), token=token)


def find_token() -> str:
    """HF_TOKEN, else the token stored by `hf auth login`."""
    from huggingface_hub import get_token

    token = get_token()
    if not token:
        raise PushError(
            "no Hugging Face token found: create a token with write access at "
            "https://huggingface.co/settings/tokens, then run `hf auth login` or set the HF_TOKEN environment variable"
        )
    return token


def check_online() -> None:
    from huggingface_hub import constants

    if constants.is_offline_mode():
        raise PushError(
            "HF_HUB_OFFLINE is set, so nothing can be pushed: unset HF_HUB_OFFLINE (and TRANSFORMERS_OFFLINE)"
        )


def check_repo_id(repo_id: str) -> str:
    """Return the repo id if it is a legal 'namespace/name', else raise PushError saying what is wrong."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    if not isinstance(repo_id, str) or repo_id.count("/") != 1:
        raise PushError(f"Hub repo id {repo_id!r} must look like namespace/name, e.g. your-user/my-model")
    try:
        validate_repo_id(repo_id)
    except HFValidationError as exc:
        raise PushError(
            f"{repo_id!r} is not a legal Hub repo id ({exc}). Use namespace/name with letters, digits, '-', '_' "
            "or '.', no '--' or '..', not starting or ending with '-' or '.', at most 96 characters"
        ) from None
    return repo_id


def namespace_write_problem(whoami: dict[str, Any], namespace: str, repo_id: str) -> str | None:
    """Why this token cannot create or write repos in `namespace`, or None if it can.

    Pure function of the /api/whoami-v2 answer, so every case is testable without a Hub.
    """
    user = whoami.get("name", "")
    access = (whoami.get("auth") or {}).get("accessToken") or {}
    role = access.get("role")
    if role == "read":
        return "the token is read-only: create a token with write access at https://huggingface.co/settings/tokens"
    orgs = {org.get("name"): org.get("roleInOrg") for org in whoami.get("orgs") or []}
    if namespace != user and namespace not in orgs:
        known = ", ".join([user, *sorted(o for o in orgs if o)])
        return f"namespace {namespace!r} is neither your user nor one of your organizations ({known})"
    if namespace in orgs and namespace != user and orgs[namespace] not in WRITING_ORG_ROLES:
        return f"your role in organization {namespace!r} is {orgs[namespace]!r}, which cannot create or write repos"
    if role == "fineGrained" and not _fine_grained_can_write(access.get("fineGrained") or {}, namespace, repo_id):
        return (
            f"the fine-grained token has no 'repo.write' permission for {namespace!r}: edit the token at "
            "https://huggingface.co/settings/tokens"
        )
    return None


def _fine_grained_can_write(fine: dict[str, Any], namespace: str, repo_id: str) -> bool:
    for scope in fine.get("scoped") or []:
        entity = scope.get("entity") or {}
        if entity.get("name") in (namespace, repo_id) and "repo.write" in (scope.get("permissions") or []):
            return True
    return False


def preflight_push(repo_id: str, private: bool) -> PushTarget:
    """Check before any long work that a push to `repo_id` can succeed; raise PushError otherwise.

    Checks: repo id legal, not offline, token present and accepted (whoami), namespace writable
    (own user or an org where the token may write), and for an existing repo: write access and
    that a public repo is not silently used when a private one was asked for.
    """
    check_repo_id(repo_id)
    check_online()
    api = hub_api(find_token())
    whoami = _whoami(api)
    namespace = repo_id.split("/")[0]
    problem = namespace_write_problem(whoami, namespace, repo_id)
    if problem:
        raise PushError(f"cannot push to {repo_id}: {problem}")
    info = _repo_info_or_none(api, repo_id)
    if info is not None:
        _check_existing_repo(api, repo_id, private, info)
    return PushTarget(repo_id, whoami.get("name", ""), info is not None, bool(info.private) if info else private)


def _whoami(api) -> dict[str, Any]:
    from huggingface_hub.errors import HfHubHTTPError

    try:
        return api.whoami()
    except HfHubHTTPError as exc:
        status = exc.response.status_code if exc.response is not None else None
        if status == 401:
            raise PushError(
                "the Hugging Face token was rejected (401 Unauthorized): it is invalid, expired or revoked. "
                "Create a new write token at https://huggingface.co/settings/tokens and run `hf auth login` "
                "(HF_TOKEN, if set, takes precedence over the stored login)"
            ) from None
        raise PushError(f"could not check the token with {hub_endpoint()}: {_short(exc)}") from None
    except OSError as exc:
        raise PushError(f"cannot reach {hub_endpoint()}: {exc}") from None


def _repo_info_or_none(api, repo_id: str):
    from huggingface_hub.errors import HfHubHTTPError, RepositoryNotFoundError

    try:
        return api.model_info(repo_id)
    except RepositoryNotFoundError:
        return None
    except HfHubHTTPError as exc:
        raise PushError(f"could not look up {repo_id} on {hub_endpoint()}: {_short(exc)}") from None
    except OSError as exc:
        raise PushError(f"cannot reach {hub_endpoint()}: {exc}") from None


def _check_existing_repo(api, repo_id: str, private: bool, info) -> None:
    if private and info.private is False:
        raise PushError(
            f"{repo_id} already exists and is PUBLIC, but a private push was asked for. Make the repo private "
            "on the Hub, choose another repo id, or push publicly on purpose (--public / export.private=false)"
        )
    if not _can_write_existing(api, repo_id):
        raise PushError(f"{repo_id} exists but this token may not write to it: ask its owner for write access")


def _can_write_existing(api, repo_id: str) -> bool:
    """Ask the preupload endpoint (which needs write access) about a tiny file; nothing is uploaded."""
    import base64

    from huggingface_hub.utils import build_hf_headers, get_session

    url = f"{api.endpoint}/api/models/{repo_id}/preupload/main"
    payload = {"files": [{"path": "README.md", "sample": base64.b64encode(b"#").decode(), "size": 1}]}
    response = get_session().post(url, json=payload, headers=build_hf_headers(token=api.token))
    return response.status_code not in (401, 403)


def push_folder(
    folder: Path, repo_id: str, private: bool, *, commit_message: str | None = None, progress: Progress = None
) -> str:
    """Create the repo if needed and upload `folder`; return the repo URL. The folder itself is not touched."""
    from huggingface_hub.errors import HfHubHTTPError

    say = progress or (lambda _message: None)
    check_repo_id(repo_id)
    check_online()
    api = hub_api(find_token())
    retry = f"the local export at {folder} is intact; retry the push alone with the same export command"
    try:
        say(f"Creating {'private' if private else 'public'} repo {repo_id} (if it does not exist) ...")
        url = api.create_repo(repo_id, private=private, exist_ok=True)
        say(f"Uploading {folder} to {repo_id} ...")
        api.upload_folder(
            repo_id=repo_id,
            folder_path=str(folder),
            commit_message=commit_message or f"Upload {folder.name} with finetune_app",
            delete_patterns=REPLACED_ON_PUSH,
        )
    except HfHubHTTPError as exc:
        raise PushError(f"push to {repo_id} failed: {_short(exc)}\n{retry}") from None
    except ValueError as exc:  # the Hub rejected the model card's metadata
        raise PushError(f"push to {repo_id} refused: {_short(exc)}\n{retry}") from None
    except OSError as exc:
        raise PushError(f"push to {repo_id} failed, cannot reach {hub_endpoint()}: {exc}\n{retry}") from None
    say(f"Pushed to {url}")
    return str(url)


def _short(exc: Exception) -> str:
    """The first meaningful lines of a Hub error (its full text repeats request ids and URLs)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return " ".join(lines[:3])[:500]
