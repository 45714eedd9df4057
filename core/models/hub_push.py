"""Pushing an export to the Hugging Face Hub (`export_hub_model_id`), as LLaMA-Factory does after export.

The folder is written first; the push uploads the files tuneline wrote there (never a file of the
user's beside them) into the repository, created if missing, with `hf_hub_token`. When the hub
cannot be reached (HF_HUB_OFFLINE=1, no network, a refused token), the export stays complete and
the error says how to push it later.
"""

from __future__ import annotations

from pathlib import Path

from tuneline.core.errors import TunelineError


def push_export(folder: str | Path, *, entries: list[str], repo_id: str, token: str | None) -> str:
    """Upload `entries` (files and folders) of `folder` to the model repository `repo_id`; its URL."""
    from huggingface_hub import HfApi, constants

    folder = Path(folder).resolve()  # named in full in the message
    patterns = [pattern for name in entries for pattern in (name, f"{name}/**")]
    api = HfApi(token=token)
    try:
        api.create_repo(repo_id, repo_type="model", exist_ok=True)
        api.upload_folder(folder_path=str(folder), repo_id=repo_id, repo_type="model", allow_patterns=patterns,
                          commit_message="Upload the model exported by tuneline")
    except Exception as e:  # offline mode, connection and HTTP errors each have their own class
        if constants.HF_HUB_OFFLINE:
            why = "the hub is offline here (HF_HUB_OFFLINE=1)"
        else:
            why = f"the hub refused it or cannot be reached ({type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:200]})"
        raise TunelineError(f"'export_hub_model_id: {repo_id}': the export is complete in {folder}, but pushing it to the "
                          f"Hugging Face Hub failed: {why}. Push it from a machine that reaches the hub with "
                          f"`hf upload {repo_id} {folder}` (with a write token in 'hf_hub_token' or HF_TOKEN), or remove "
                          "export_hub_model_id to export locally only.") from e
    return f"{constants.ENDPOINT}/{repo_id}"
