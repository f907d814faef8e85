"""Pushing exports with the real huggingface_hub client against the local Hub-compatible server."""

from __future__ import annotations

import pytest
from hubserver import HubServer
from test_export import cli, make_run_dir, tree_bytes

from finetune_app import hub
from finetune_app.config import load_config
from finetune_app.export import export_adapter, export_after_training, read_export_marker

TOKEN = "hf_test_alice_write_token"


@pytest.fixture
def hub_server(monkeypatch, tmp_path):
    from huggingface_hub import constants

    server = HubServer().start()
    server.add_user(TOKEN, "alice", orgs={"acme": "write", "readers": "read", "helpers": "contributor"})
    monkeypatch.setenv("HF_ENDPOINT", server.endpoint)
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)  # conftest makes the suite offline
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "no-stored-token"))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, tiny_model_dir):
    return make_run_dir(tmp_path_factory.mktemp("hub"), tiny_model_dir)


def test_push_adapter_creates_private_repo_with_the_export_byte_for_byte(hub_server, run_dir, capsys):
    assert cli(run_dir, "--adapter", "--push", "alice/tiny-adapter", "--private", "--rebuild") == 0
    repo = hub_server.repo("alice/tiny-adapter")
    assert repo.private is True
    local = tree_bytes(run_dir / "exports" / "adapter")
    assert repo.files == local
    card = repo.files["README.md"].decode()
    assert 'PeftModel.from_pretrained(base, "alice/tiny-adapter")' in card
    assert "training_loss.png" in repo.files and "![Training loss](training_loss.png)" in card
    assert "| total | 3.00 |" in card and "allocated_peak: 2.00 GiB" in card
    assert card in hub_server.state.validated_cards  # the client had the Hub validate the card's metadata
    assert "Pushed to" in capsys.readouterr().out


def test_public_push_and_repush_replaces_files(hub_server, run_dir):
    assert cli(run_dir, "--adapter", "--push", "acme/shared", "--public") == 0
    assert hub_server.repo("acme/shared").private is False
    hub_server.repo("acme/shared").files["old-weights.safetensors"] = b"stale"
    assert cli(run_dir, "--adapter", "--push", "acme/shared", "--public") == 0
    assert "old-weights.safetensors" not in hub_server.repo("acme/shared").files  # stale weights removed


def test_push_merged_model(hub_server, run_dir, tmp_path):
    assert cli(run_dir, "--merge", "--dtype", "fp32", "--push", "alice/tiny-merged", "--output", tmp_path / "m") == 0
    files = hub_server.repo("alice/tiny-merged").files
    assert files == tree_bytes(tmp_path / "m")
    assert "model.safetensors" in files and "merge_check.json" in files
    assert 'AutoModelForCausalLM.from_pretrained("alice/tiny-merged"' in files["README.md"].decode()


def test_failed_push_keeps_local_export_and_retry_reuses_it(hub_server, run_dir, capsys):
    export_adapter(run_dir, rebuild=True)
    created = read_export_marker(run_dir / "exports" / "adapter")["created"]
    hub_server.fail_next_commits(1000, status=507)  # not a status the client retries
    assert cli(run_dir, "--adapter", "--push", "alice/flaky") == 1
    err = capsys.readouterr().err
    assert "push to alice/flaky failed" in err and "local export" in err and "intact" in err
    assert "Traceback" not in err
    assert read_export_marker(run_dir / "exports" / "adapter")["created"] == created
    assert hub_server.repo("alice/flaky").files == {}

    hub_server.fail_next_commits(0)
    assert cli(run_dir, "--adapter", "--push", "alice/flaky") == 0
    assert "Reusing the existing adapter export" in capsys.readouterr().out
    assert hub_server.repo("alice/flaky").files == tree_bytes(run_dir / "exports" / "adapter")


def test_transient_server_error_is_retried_by_the_client(hub_server, run_dir):
    folder = export_adapter(run_dir)
    hub_server.fail_next_commits(1, status=500)
    hub.push_folder(folder, "alice/retry", private=True)
    assert hub_server.state.commit_attempts == 2
    assert hub_server.repo("alice/retry").files == tree_bytes(folder)


def test_export_after_training_pushes_what_the_config_says(hub_server, tmp_path, tiny_model_dir):
    config = {"export": {"push_to_hub": "alice/after-run", "push_what": "adapter", "private": False}}
    run = make_run_dir(tmp_path, tiny_model_dir, config=config)
    result = export_after_training(load_config(run / "config.yaml"), run)
    assert result.ok, result.problems
    assert result.repo_url.endswith("/alice/after-run")
    assert hub_server.repo("alice/after-run").private is False
    assert hub_server.repo("alice/after-run").files == tree_bytes(run / "exports" / "adapter")


def test_export_after_training_reports_a_failed_push_and_keeps_the_export(hub_server, tmp_path, tiny_model_dir):
    run = make_run_dir(tmp_path, tiny_model_dir, config={"export": {"push_to_hub": "alice/broken"}})
    hub_server.fail_next_commits(1000, status=507)
    result = export_after_training(load_config(run / "config.yaml"), run)
    assert not result.ok and "push to alice/broken failed" in result.problems[0]
    assert read_export_marker(result.adapter_dir)["kind"] == "adapter"


# ---------------------------------------------------------------------------------------------
# Pre-flight


def test_preflight_accepts_own_namespace_and_writable_org(hub_server):
    target = hub.preflight_push("alice/new-model", private=True)
    assert (target.user, target.exists) == ("alice", False)
    assert hub.preflight_push("acme/new-model", private=True).exists is False


def test_preflight_rejects_a_bad_token(hub_server, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_wrong")
    with pytest.raises(hub.PushError, match=r"token was rejected \(401 Unauthorized\)"):
        hub.preflight_push("alice/model", private=True)


def test_preflight_rejects_illegal_repo_ids(hub_server):
    for bad in ("alice/bad..name", "alice/-x", "alice/with space", "a/b/c", "noslash"):
        with pytest.raises(hub.PushError, match="repo id|namespace/name"):
            hub.preflight_push(bad, private=True)


def test_preflight_rejects_namespaces_without_write_access(hub_server):
    with pytest.raises(hub.PushError, match="role in organization 'readers' is 'read'"):
        hub.preflight_push("readers/model", private=True)
    with pytest.raises(hub.PushError, match="neither your user nor one of your organizations"):
        hub.preflight_push("bob/model", private=True)


def test_preflight_rejects_existing_repo_without_write_access(hub_server):
    hub_server.add_repo("helpers/someone-elses", private=False)  # contributors may not write others' repos
    with pytest.raises(hub.PushError, match="may not write to it"):
        hub.preflight_push("helpers/someone-elses", private=False)


def test_preflight_refuses_public_repo_when_private_was_asked(hub_server):
    hub_server.add_repo("alice/already-public", private=False)
    with pytest.raises(hub.PushError, match="PUBLIC"):
        hub.preflight_push("alice/already-public", private=True)
    assert hub.preflight_push("alice/already-public", private=False).exists is True


def test_preflight_read_only_and_fine_grained_tokens(hub_server, monkeypatch):
    hub_server.add_user("hf_read", "carol", token_role="read")
    hub_server.add_user("hf_fine", "dave", token_role="fineGrained", fine_grained_write=["dave"])
    monkeypatch.setenv("HF_TOKEN", "hf_read")
    with pytest.raises(hub.PushError, match="read-only"):
        hub.preflight_push("carol/model", private=True)
    monkeypatch.setenv("HF_TOKEN", "hf_fine")
    assert hub.preflight_push("dave/model", private=True).user == "dave"


def test_no_token_and_offline_fail_clearly(hub_server, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.delenv("HF_TOKEN")
    with pytest.raises(hub.PushError, match="no Hugging Face token found"):
        hub.preflight_push("alice/model", private=True)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(hub.PushError, match="HF_HUB_OFFLINE"):
        hub.preflight_push("alice/model", private=True)


def test_namespace_write_problem_is_a_pure_function_of_whoami():
    whoami = {
        "name": "alice",
        "orgs": [{"name": "acme", "roleInOrg": "admin"}, {"name": "viewers", "roleInOrg": "read"}],
        "auth": {
            "accessToken": {
                "role": "fineGrained",
                "fineGrained": {
                    "scoped": [
                        {"entity": {"type": "org", "name": "acme"}, "permissions": ["repo.write"]},
                        {"entity": {"type": "model", "name": "alice/one"}, "permissions": ["repo.write"]},
                    ]
                },
            }
        },
    }
    assert hub.namespace_write_problem(whoami, "acme", "acme/x") is None
    assert hub.namespace_write_problem(whoami, "alice", "alice/one") is None
    assert "repo.write" in hub.namespace_write_problem(whoami, "alice", "alice/two")
    assert "'read'" in hub.namespace_write_problem(whoami, "viewers", "viewers/x")


def test_hub_endpoint_is_read_at_call_time(monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9/")
    assert hub.hub_endpoint() == "http://127.0.0.1:9"
    monkeypatch.delenv("HF_ENDPOINT")
    assert hub.hub_endpoint() == "https://huggingface.co"
