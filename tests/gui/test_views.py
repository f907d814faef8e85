import re
import shlex

import pytest

from finetune_app.config import ConfigError, RunConfig, build_config, load_config
from finetune_app.gui import budget_view, hardware_view, presets, train_view
from finetune_app.gui.jobs import Job, summarize_events
from finetune_app.hardware import GPU_CATALOGUE, GPUInfo, HardwareInfo
from finetune_app.memory import advice
from finetune_app.memory.estimator import estimate_memory
from finetune_app.memory.shape import load_model_shape

HUGE = {"training": {"max_length": 16384, "micro_batch_size": 8}, "memory": {"gradient_checkpointing": False}}


def shown_total(page: str) -> int:
    return int(re.search(r'id="budget-total" data-bytes="(\d+)"', page).group(1))


def shown_verdict(page: str) -> str:
    return re.search(r'data-verdict="(\w+)"', page).group(1)


def test_budget_shows_the_estimator_total_and_verdict():
    cfg = RunConfig()
    t4 = GPU_CATALOGUE["T4"]
    page, advice_md = budget_view.render(cfg, [t4])
    estimate = estimate_memory(cfg, load_model_shape(cfg.model.name_or_path))
    assert shown_total(page) == estimate.total
    assert shown_verdict(page) == advice.verdict(estimate, t4.total_bytes).status == "fits"
    assert "**Fits**" in advice_md
    assert "bfloat16 is not supported by GPU 0 (T4" in page  # hardware problems are warned about, not hidden
    for label in ("Model weights", "Quantization constants", "LoRA parameters", "Optimizer states", "CUDA context"):
        assert label in page


def test_budget_that_does_not_fit_lists_savings_and_fit_applies_them():
    cfg = build_config(HUGE)
    gpu = GPU_CATALOGUE["RTX 4090"]
    page, advice_md = budget_view.render(cfg, [gpu])
    assert shown_verdict(page) == "does_not_fit"
    assert "gradient checkpointing: **−" in advice_md
    fitted, message = budget_view.fit(cfg, [gpu])
    assert fitted is not None and "now fits" in message
    shape = load_model_shape(cfg.model.name_or_path)
    assert advice.verdict(estimate_memory(fitted, shape), gpu.total_bytes).fits
    assert budget_view.fit(fitted, [gpu])[0] is None  # nothing left to do


def test_budget_draws_one_bar_per_gpu_of_the_run():
    cfg = build_config({"distributed": {"strategy": "ddp", "num_processes": 2}})
    page, _ = budget_view.render(cfg, [GPU_CATALOGUE["L4"]] * 4)
    assert page.count('class="gpu-row"') == 2
    page, _ = budget_view.render(cfg, [GPU_CATALOGUE["L4"]])
    assert "only 1 are planned" in page


def test_budget_of_an_unknown_model_is_an_explanation_not_a_crash(tmp_path):
    cfg = build_config({"model": {"name_or_path": str(tmp_path / "missing")}})
    page, advice_md = budget_view.render(cfg, [GPU_CATALOGUE["T4"]])
    assert "Cannot size" in page and 'data-verdict="unknown"' in page


def test_hardware_panel_with_and_without_gpus():
    empty = HardwareInfo(cpu_ram_total=16 << 30, cpu_ram_available=8 << 30)
    assert "No NVIDIA GPU was found" in hardware_view.hardware_html(empty)
    assert hardware_view.THIS_MACHINE not in hardware_view.target_choices(empty)
    gpu = GPUInfo(0, "NVIDIA L4", 23 << 30, 20 << 30, (8, 9))
    info = HardwareInfo([gpu], "550.54", "12.4", 64 << 30, 60 << 30)
    html = hardware_view.hardware_html(info)
    assert "NVIDIA L4" in html and "8.9" in html and "550.54" in html and "CUDA 12.4" in html
    assert hardware_view.target_choices(info)[0] == hardware_view.THIS_MACHINE
    assert hardware_view.default_target(info) == hardware_view.THIS_MACHINE
    assert hardware_view.plan_gpus("T4", 3) == [GPU_CATALOGUE["T4"]] * 3


def test_presets_save_load_and_headless_command_round_trip(tmp_path):
    base = build_config({"training": {"max_steps": 10}})
    presets.save_preset(base, "mine", tmp_path)
    assert presets.list_presets(tmp_path) == ["mine"]
    assert presets.load_preset("mine", tmp_path) == base
    with pytest.raises(ConfigError, match="not usable as a file name"):
        presets.save_preset(base, "../evil", tmp_path)
    with pytest.raises(ConfigError, match="exists already"):
        presets.save_preset(build_config({}), "mine", tmp_path)
    assert presets.load_preset("mine", tmp_path) == base  # the saved preset was not overwritten

    changed = build_config(
        {
            "training": {"max_steps": 10},
            "lora": {"r": 64, "target_modules": ["q_proj", "v_proj"]},
            "model": {"revision": "v1.0"},
        }
    )
    text = presets.headless_commands(changed, "mine", tmp_path)
    train_line = text.splitlines()[0]
    argv = shlex.split(train_line)
    assert argv[:4] == ["python", "-m", "finetune_app", "train"]
    assert load_config(argv[4], argv[5:]) == changed
    launcher_line = next(line for line in text.splitlines() if line.startswith("python launcher.py"))
    assert "--set lora.r=64" in launcher_line


def test_train_view_status_and_loss_figure(tmp_path):
    job = Job(run_dir=tmp_path, pid=0, started=0, command=[])
    job.progress = summarize_events(
        [
            {"event": "train_begin", "total_steps": 2},
            {"event": "log", "step": 1, "loss": 2.0},
            {"event": "log", "step": 2, "loss": 1.0},
            {"event": "eval", "step": 2, "eval_loss": 1.5},
            {"event": "end", "status": "completed", "adapter_path": str(tmp_path / "adapter")},
        ]
    )
    html = train_view.status_html(job, "completed")
    assert 'data-state="completed"' in html and str(tmp_path / "adapter") in html
    axes = train_view.loss_figure(job.progress).axes[0]
    lines = {line.get_label(): (list(line.get_xdata()), list(line.get_ydata())) for line in axes.get_lines()}
    assert lines == {"training loss": ([1, 2], [2.0, 1.0]), "eval loss": ([2], [1.5])}
    assert train_view.loss_figure(job.progress.__class__()).axes[0].get_lines() == []
    assert "step 2 / 2" in html
    assert "Stopped" in train_view.status_html(job, "stopped")
    assert 'data-state="idle"' in train_view.status_html(None, None)


def test_data_preview_marks_the_trained_tokens(tiny_model_dir):
    from finetune_app.gui.data_view import preview_html

    cfg = build_config({"model": {"name_or_path": str(tiny_model_dir)}, "data": {"path": "builtin:demo-facts"}})
    html = preview_html(cfg, n=2)
    assert "id='data-format'>messages<" in html
    trained = re.findall(r"<span class='tok-train'>(.*?)</span>", html, flags=re.S)
    assert trained and not any("What is the capital" in part for part in trained)
    assert any("Quenmark" in part for part in trained)  # the assistant's answer carries the loss
    context = re.findall(r"<span class='tok-ctx'>(.*?)</span>", html, flags=re.S)
    assert any("What is the capital of Veloria?" in part for part in context)  # the question does not


def test_data_preview_explains_bad_data(tmp_path, tiny_model_dir):
    from finetune_app.gui.data_view import preview_html

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"foo": 1}\n')
    cfg = build_config({"model": {"name_or_path": str(tiny_model_dir)}, "data": {"path": str(bad)}})
    html = preview_html(cfg)
    assert "preview-error" in html and "cannot be used" in html


def test_uploads_are_kept_without_overwriting(tmp_path, monkeypatch):
    from finetune_app.gui.data_view import keep_upload

    monkeypatch.setenv("FINETUNE_APP_HOME", str(tmp_path / "home"))
    first, second = tmp_path / "a" / "d.jsonl", tmp_path / "b" / "d.jsonl"
    for path, text in ((first, "1\n"), (second, "2\n")):
        path.parent.mkdir()
        path.write_text(text)
    kept_first, kept_second = keep_upload(str(first)), keep_upload(str(second))
    assert kept_first != kept_second and kept_first.read_text() == "1\n" and kept_second.read_text() == "2\n"
    assert keep_upload(str(first)) == kept_first  # the same file again is not duplicated
    with pytest.raises(ValueError, match="unsupported file type"):
        keep_upload(str(tmp_path / "notes.txt"))
