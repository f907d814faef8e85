"""The Hub token must never reach a file, a log line or the console: run exports + pushes with a
distinctive fake token (debug logging on) and search everything they produced for it."""

from __future__ import annotations

import logging

from hubserver import HubServer
from test_export import cli, make_run_dir

from finetune_app.config import load_config
from finetune_app.export import export_after_training

SECRET = "hf_LEAKCHECK_7d1f0b9c4e2a8"


def test_token_never_written_or_printed(monkeypatch, tmp_path, tiny_model_dir, capfd, caplog):
    from huggingface_hub import constants
    from huggingface_hub.utils import logging as hf_logging

    server = HubServer().start()
    try:
        server.add_user(SECRET, "alice")
        monkeypatch.setenv("HF_ENDPOINT", server.endpoint)
        monkeypatch.setenv("HF_TOKEN", SECRET)
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
        hf_logging.set_verbosity_debug()
        caplog.set_level(logging.DEBUG)

        config = {
            "export": {
                "merge": True,
                "merge_dtype": "float32",
                "push_to_hub": "alice/after-run",
                "push_what": "merged",
                "private": True,
            }
        }
        run = make_run_dir(tmp_path, tiny_model_dir, config=config)
        result = export_after_training(load_config(run / "config.yaml"), run, progress=print)
        assert result.ok, result.problems
        assert cli(run, "--adapter", "--push", "alice/adapter") == 0
        server.fail_next_commits(1000, status=507)
        assert cli(run, "--adapter", "--push", "alice/failing", "--rebuild") == 1  # error paths too
    finally:
        hf_logging.set_verbosity_warning()
        server.stop()

    assert SECRET in server.state.tokens_seen  # the token really was used for the pushes
    assert server.repo("alice/after-run").files and server.repo("alice/adapter").files
    needle = SECRET.encode()
    files = [path for path in tmp_path.rglob("*") if path.is_file()]
    assert len(files) > 20
    assert [path for path in files if needle in path.read_bytes()] == []
    for repo in server.state.repos.values():
        assert [name for name, data in repo.files.items() if needle in data] == []
    out, err = capfd.readouterr()
    assert "Pushed to" in out and "push to alice/failing failed" in err
    assert SECRET not in out and SECRET not in err
    assert caplog.records and SECRET not in caplog.text
