"""Hub login for the Export tab: say whether a token is available and store a pasted one. Never shows it."""

from __future__ import annotations


def token_status() -> str:
    """Whether a Hub token is available, never the token itself."""
    try:
        from huggingface_hub import get_token

        found = bool(get_token())
    except Exception:
        found = False
    if found:
        return "A Hugging Face token is available (from `hf auth login` or HF_TOKEN)."
    return "No Hugging Face token yet: paste one above (or run `hf auth login`) before pushing."


def save_token(token: str) -> tuple[str, str]:
    """Store a token like `hf auth login`; returns (cleared textbox, status). The token is never echoed."""
    token = (token or "").strip()
    if not token:
        return "", "Paste a token first (https://huggingface.co/settings/tokens, with write access)."
    try:
        from huggingface_hub import login

        login(token=token, add_to_git_credential=False, skip_if_logged_in=False)
    except Exception as exc:
        # Messages of the hub client never contain the token; still, show only the exception type and the reason.
        return "", f"Login failed: {type(exc).__name__}: {str(exc).replace(token, '***')}"
    return "", token_status()
