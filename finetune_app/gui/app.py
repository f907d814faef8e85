"""The Gradio app: layout and wiring. The logic lives in the neighbouring modules (widgets, jobs, views).

Tabs follow the path of a first fine-tune: 1 Hardware -> 2 Configure (with the live memory budget beside the
settings) -> 3 Train -> 4 Try it -> 5 Export. Every RunConfig field has a widget (generated, see widgets.py).
Training runs in a child process (jobs.py); the page polls its events once a second.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import gradio as gr

from finetune_app.config import ConfigError, RunConfig
from finetune_app.gui import budget_view, hardware_view, hub_login, presets, train_view
from finetune_app.gui.jobs import JobError, get_manager, new_run_dir
from finetune_app.gui.widgets import (
    FieldSpec,
    config_to_values,
    dependent_updates,
    field_specs,
    make_widget,
    section_titles,
    try_config,
)

DEFAULT_PRESET = "demo-smollm2-135m"
INTRO = (
    "# Fine-tune a language model\n"
    "**1 Hardware** → **2 Configure** (model, data, settings; the memory budget updates as you go) → "
    "**3 Train** → **4 Try it** → **5 Export**. The defaults train a small demo model that runs on any computer, "
    "even without a GPU: just go to *Train* and press *Start*."
)
# Sections shown open; the rest are folded (everything an expert needs is there, nothing hidden).
OPEN_SECTIONS = ("model", "data")


def initial_config() -> tuple[RunConfig, str | None]:
    """The demo preset when it exists (a first run just works), else the RunConfig defaults."""
    if DEFAULT_PRESET in presets.list_presets():
        try:
            return presets.load_preset(DEFAULT_PRESET), DEFAULT_PRESET
        except ConfigError:
            pass
    return RunConfig(), None


def build_app() -> gr.Blocks:
    specs = field_specs()
    cfg0, preset0 = initial_config()
    values0 = config_to_values(cfg0, specs)
    manager = get_manager()

    with gr.Blocks(title="finetune_app: fine-tune an LLM") as demo:
        gr.Markdown(INTRO)
        with gr.Tabs(selected="configure"):
            # ------------------------------------------------------------------ 1 Hardware
            with gr.Tab("1 · Hardware", id="hardware"):
                hardware_html = gr.HTML(elem_id="hardware-panel")
                with gr.Row():
                    target_gpu = gr.Dropdown(
                        label="Plan the memory budget for",
                        info="This computer's GPUs, or a GPU you want to rent or buy (no GPU is needed for planning).",
                        choices=hardware_view.target_choices(None),
                        value=hardware_view.default_target(None),
                        elem_id="target-gpu",
                        scale=3,
                    )
                    target_count = gr.Number(
                        label="number of GPUs",
                        value=1,
                        minimum=1,
                        maximum=64,
                        precision=0,
                        elem_id="target-count",
                        scale=1,
                    )
                    refresh_hw = gr.Button("Refresh", scale=0)

            # ------------------------------------------------------------------ 2 Configure
            with gr.Tab("2 · Configure", id="configure"):
                with gr.Row(equal_height=False):
                    with gr.Column(scale=3):
                        with gr.Row(equal_height=False, elem_id="preset-row"):
                            preset_pick = gr.Dropdown(
                                label="Preset",
                                choices=presets.list_presets(),
                                value=preset0,
                                scale=3,
                                info="Saved settings (YAML files in the presets/ folder).",
                                elem_id="preset-pick",
                            )
                            preset_load = gr.Button("Load", scale=1, min_width=80, elem_id="preset-load")
                            preset_name = gr.Textbox(
                                label="Save as", placeholder="my-run", scale=3, info="Name of a new preset file."
                            )
                            preset_save = gr.Button("Save", scale=1, min_width=80, elem_id="preset-save")
                        preset_msg = gr.Markdown(elem_id="preset-message")
                        widgets, extras = _section_widgets(specs, values0, {"data": _data_extras})
                        by_key = dict(zip([s.key for s in specs], widgets, strict=True))
                        upload, preview_btn, preview = extras["data"]
                    with gr.Column(scale=2, elem_id="budget-column"):
                        errors = gr.Markdown(elem_id="config-errors")
                        budget = gr.HTML(elem_id="budget-panel")
                        advice = gr.Markdown(elem_id="budget-advice")
                        fit_btn = gr.Button("Fit to my GPU", variant="secondary", elem_id="fit-btn")
                        fit_msg = gr.Markdown(elem_id="fit-message")
                        command = gr.Code(label="Same run from a terminal", language="shell", elem_id="headless-cmd")

            # ------------------------------------------------------------------ 3 Train
            with gr.Tab("3 · Train", id="train"):
                with gr.Row():
                    start_btn = gr.Button("Start training", variant="primary", elem_id="start-btn")
                    stop_btn = gr.Button(
                        "Stop (saves a checkpoint)", variant="stop", interactive=False, elem_id="stop-btn"
                    )
                train_summary = gr.Markdown(elem_id="train-summary")
                train_msg = gr.Markdown(elem_id="train-message")
                run_status = gr.HTML(train_view.status_html(None, None), elem_id="run-status-panel")
                with gr.Row(equal_height=False):
                    loss_plot = gr.Plot(label="Loss", elem_id="loss-plot", scale=3)
                    run_stats = gr.HTML(elem_id="run-stats-panel")
                log_tail = gr.Textbox(
                    label="Log (train.log)",
                    lines=12,
                    max_lines=12,
                    autoscroll=True,
                    interactive=False,
                    elem_id="log-tail",
                )
                timer = gr.Timer(1.0)
                seen = gr.State({})

            # ------------------------------------------------------------------ 4 Try it
            with gr.Tab("4 · Try it", id="try") as try_tab:
                gr.Markdown(
                    "Ask a question; the base model and your fine-tuned model answer side by side "
                    "(the first question loads the model, which takes a moment)."
                )
                with gr.Row():
                    adapter_pick = gr.Dropdown(
                        label="Fine-tuned adapter", choices=[], allow_custom_value=True, scale=4, elem_id="adapter-pick"
                    )
                    adapter_refresh = gr.Button("Refresh", scale=0)
                question = gr.Textbox(label="Your question", placeholder="What is the capital of Veloria?", lines=2)
                gr.Examples(examples=_example_questions(), inputs=[question])
                ask_btn = gr.Button("Ask both", variant="primary")
                with gr.Row():
                    base_answer = gr.Textbox(label="Base model", lines=6, interactive=False, elem_id="base-answer")
                    tuned_answer = gr.Textbox(label="Fine-tuned", lines=6, interactive=False, elem_id="tuned-answer")

            # ------------------------------------------------------------------ 5 Export
            with gr.Tab("5 · Export", id="export") as export_tab:
                gr.Markdown(
                    "Save the adapter (small, needs the base model), merge it into the base (a standalone model) "
                    "or push either to the Hugging Face Hub. Pushing uses your `hf auth login` token or HF_TOKEN."
                )
                with gr.Row():
                    run_pick = gr.Dropdown(label="Run", choices=[], allow_custom_value=True, scale=4)
                    run_refresh = gr.Button("Refresh", scale=0)
                with gr.Row():
                    merge_dtype = gr.Dropdown(
                        label="Merged weights dtype", choices=["bfloat16", "float16", "float32"], value="bfloat16"
                    )
                    repo_id = gr.Textbox(label="Hub repo id", placeholder="your-name/my-model")
                    push_what = gr.Dropdown(label="Push", choices=["adapter", "merged"], value="adapter")
                    private = gr.Checkbox(label="private repo", value=True)
                with gr.Row():
                    save_adapter_btn = gr.Button("Save adapter")
                    merge_btn = gr.Button("Merge into base")
                    push_btn = gr.Button("Push to Hub")
                with gr.Accordion("Hub login", open=False):
                    token_box = gr.Textbox(
                        label="Hugging Face token (write access)",
                        type="password",
                        info="Stored like `hf auth login` does; it is never shown again.",
                    )
                    token_btn = gr.Button("Log in")
                    token_msg = gr.Markdown(hub_login.token_status())
                export_log = gr.Textbox(label="Progress", lines=8, interactive=False)
                export_result = gr.Markdown(elem_id="export-result")

        # ---------------------------------------------------------------------- wiring
        settings_outputs = [budget, advice, errors, command, train_summary]
        budget_inputs = [*widgets, target_gpu, target_count, preset_pick]

        def on_settings(*values):
            *field_values, gpu_choice, count, preset = values
            return _settings_view(specs, field_values, gpu_choice, count, preset)

        for spec, widget in zip(specs, widgets, strict=True):
            for trigger in _triggers(spec, widget):
                trigger(
                    on_settings,
                    inputs=budget_inputs,
                    outputs=settings_outputs,
                    trigger_mode="always_last",
                    show_progress="hidden",
                )

        # 4-bit only options follow the quantization mode, so switching it never leaves an invalid config.
        dependent_keys = ["quantization.double_quant", "quantization.quant_type"]

        def on_load_in(load_in):
            updates = dependent_updates(load_in)
            return [updates.get(key, gr.skip()) for key in dependent_keys]

        by_key["quantization.load_in"].input(
            on_load_in,
            inputs=[by_key["quantization.load_in"]],
            outputs=[by_key[k] for k in dependent_keys],
            show_progress="hidden",
        ).then(on_settings, inputs=budget_inputs, outputs=settings_outputs, show_progress="hidden")

        for trigger in (target_gpu.input, target_count.input):
            trigger(on_settings, inputs=budget_inputs, outputs=settings_outputs, show_progress="hidden")

        def on_hardware(gpu_choice):
            info = hardware_view.detect(refresh=True)
            choices = hardware_view.target_choices(info)
            value = gpu_choice if gpu_choice in choices else hardware_view.default_target(info)
            return hardware_view.hardware_html(info), gr.update(choices=choices, value=value)

        refresh_hw.click(on_hardware, inputs=[target_gpu], outputs=[hardware_html, target_gpu]).then(
            on_settings, inputs=budget_inputs, outputs=settings_outputs
        )

        # Presets
        def on_preset_load(name):
            if not name:
                return [gr.skip()] * len(widgets) + ["Pick a preset first."]
            try:
                cfg = presets.load_preset(name)
            except ConfigError as exc:
                return [gr.skip()] * len(widgets) + [f"**Cannot load {name}:**\n```\n{exc}\n```"]
            return [*config_to_values(cfg, specs), f"Loaded preset **{name}**."]

        preset_load.click(on_preset_load, inputs=[preset_pick], outputs=[*widgets, preset_msg]).then(
            on_settings, inputs=budget_inputs, outputs=settings_outputs
        )

        def on_preset_save(name, *values):
            cfg, error = try_config(specs, list(values))
            if cfg is None:
                return gr.skip(), f"**Fix the settings first:**\n```\n{error}\n```"
            try:
                path = presets.save_preset(cfg, name or "")
            except ConfigError as exc:
                return gr.skip(), f"**Not saved:** {exc}"
            return gr.update(choices=presets.list_presets(), value=path.stem), f"Saved `{path}`."

        preset_save.click(on_preset_save, inputs=[preset_name, *widgets], outputs=[preset_pick, preset_msg]).then(
            on_settings, inputs=budget_inputs, outputs=settings_outputs
        )

        # Fit to my GPU
        def on_fit(*values):
            *field_values, gpu_choice, count, preset = values
            cfg, error = try_config(specs, field_values)
            if cfg is None:
                return [gr.skip()] * len(widgets) + [f"Fix the settings first:\n```\n{error}\n```"]
            fitted, message = budget_view.fit(cfg, hardware_view.plan_gpus(gpu_choice, count))
            if fitted is None:
                return [gr.skip()] * len(widgets) + [message]
            return [*config_to_values(fitted, specs), message]

        fit_btn.click(on_fit, inputs=budget_inputs, outputs=[*widgets, fit_msg]).then(
            on_settings, inputs=budget_inputs, outputs=settings_outputs
        )

        # Data upload and preview
        data_path = by_key["data.path"]

        def on_upload(file_path):
            from finetune_app.gui.data_view import keep_upload

            if not file_path:
                return gr.skip(), gr.skip()
            try:
                kept = keep_upload(file_path)
            except ValueError as exc:
                return gr.skip(), f"<div id='data-preview' class='preview-error'>{exc}</div>"
            return str(kept), f"Uploaded to <code>{kept}</code>. Press <i>Preview</i> to check it."

        upload.upload(on_upload, inputs=[upload], outputs=[data_path, preview]).then(
            on_settings, inputs=budget_inputs, outputs=settings_outputs
        )

        def on_preview(*values):
            from finetune_app.gui.data_view import preview_html

            cfg, error = try_config(specs, list(values))
            if cfg is None:
                return f"<div id='data-preview' class='preview-error'><pre>{error}</pre></div>"
            return preview_html(cfg)

        preview_btn.click(on_preview, inputs=widgets, outputs=[preview])

        # Train
        train_outputs = [run_status, run_stats, loss_plot, log_tail, start_btn, stop_btn, seen]

        def on_start(*values):
            cfg, error = try_config(specs, list(values))
            if cfg is None:
                return f"**Cannot start, fix these settings (tab 2):**\n```\n{error}\n```"
            try:
                job = manager.start(cfg, new_run_dir(cfg))
            except (JobError, OSError) as exc:
                return f"**Not started:** {exc}"
            return f"Started: run folder `{job.run_dir}` (pid {job.pid})."

        start_btn.click(on_start, inputs=widgets, outputs=[train_msg]).then(
            _train_view, inputs=[seen], outputs=train_outputs, show_progress="hidden"
        )
        stop_btn.click(lambda: manager.stop(), outputs=[train_msg]).then(
            _train_view, inputs=[seen], outputs=train_outputs, show_progress="hidden"
        )
        timer.tick(_train_view, inputs=[seen], outputs=train_outputs, show_progress="hidden")

        # Try it
        def on_adapters(current, *values):
            found = _adapters(specs, values)
            return gr.update(choices=found, value=current if current in found else (found[0] if found else None))

        for trigger in (adapter_refresh.click, try_tab.select):
            trigger(on_adapters, inputs=[adapter_pick, *widgets], outputs=[adapter_pick])

        def on_ask(adapter, prompt):
            from finetune_app.gui.chat import ChatError, answer_both

            if not adapter:
                return "", "No fine-tuned adapter yet: train a run first (tab 3), then press Refresh."
            try:
                return answer_both(Path(adapter), prompt)
            except ChatError as exc:
                return "", str(exc)

        ask_btn.click(on_ask, inputs=[adapter_pick, question], outputs=[base_answer, tuned_answer])
        question.submit(on_ask, inputs=[adapter_pick, question], outputs=[base_answer, tuned_answer])

        # Export
        def on_runs(current, *values):
            found = [str(Path(path).parent) for path in _adapters(specs, values)]
            return gr.update(choices=found, value=current if current in found else (found[0] if found else None))

        for trigger in (run_refresh.click, export_tab.select):
            trigger(on_runs, inputs=[run_pick, *widgets], outputs=[run_pick])
        export_inputs = [run_pick, merge_dtype, repo_id, push_what, private]
        for button, action in ((save_adapter_btn, "adapter"), (merge_btn, "merge"), (push_btn, "push")):
            button.click(
                _export_stream(action),
                inputs=export_inputs,
                outputs=[export_log, export_result],
                concurrency_limit=1,
                concurrency_id="export",
            )
        token_btn.click(hub_login.save_token, inputs=[token_box], outputs=[token_box, token_msg])

        # Page load: hardware, budget and any running job (a reload or a second tab re-attaches).
        def on_page_load(gpu_choice):
            info = hardware_view.detect()
            choices = hardware_view.target_choices(info)
            value = gpu_choice if gpu_choice in choices else hardware_view.default_target(info)
            return hardware_view.hardware_html(info), gr.update(choices=choices, value=value)

        demo.load(on_page_load, inputs=[target_gpu], outputs=[hardware_html, target_gpu]).then(
            on_settings, inputs=budget_inputs, outputs=settings_outputs
        ).then(_train_view, inputs=[seen], outputs=train_outputs, show_progress="hidden")
    return demo


# ---------------------------------------------------------------------------------------------
# Helpers used by the wiring above


def _section_widgets(specs: list[FieldSpec], values: list[Any], extras: dict[str, Any]):
    """One accordion per RunConfig section with every field inside, in declaration order.

    `extras` maps a section to a function that adds more components at the end of its accordion; what it
    returns is handed back under the same key.
    """
    titles = section_titles()
    widgets: list[gr.components.Component] = []
    made: dict[str, Any] = {}
    sections = list(dict.fromkeys(spec.section for spec in specs))
    for section in sections:
        group = [i for i, spec in enumerate(specs) if spec.section == section]
        with gr.Accordion(
            f"{section} · {titles[section]}", open=section in OPEN_SECTIONS, elem_id=f"section-{section}"
        ):
            with gr.Group():
                for row_start in range(0, len(group), 2):
                    with gr.Row(equal_height=True):
                        for i in group[row_start : row_start + 2]:
                            widgets.append(make_widget(specs[i], values[i]))
            if section in extras:
                made[section] = extras[section]()
    return widgets, made


def _data_extras():
    """Upload and preview, inside the data section."""
    with gr.Row(equal_height=True):
        upload = gr.File(
            label="Upload a .jsonl / .json / .csv / .parquet file (sets data path)",
            file_types=[".json", ".jsonl", ".csv", ".parquet"],
            height=160,
            scale=2,
        )
        preview_btn = gr.Button("Preview the first examples as the model sees them", scale=1, elem_id="preview-btn")
    preview = gr.HTML(elem_id="preview-panel")
    return upload, preview_btn, preview


def _triggers(spec: FieldSpec, widget):
    """User edits only (not programmatic updates), so loading a preset does not fire 56 events."""
    if spec.kind in ("text", "list"):
        return [widget.blur, widget.submit]
    if spec.key == "quantization.load_in":
        return []  # wired separately: it also updates the 4-bit-only fields first
    return [widget.input]


def _settings_view(specs, field_values, gpu_choice, count, preset):
    """(budget HTML, advice, errors, headless command, Train tab summary) for the current widget values."""
    cfg, error = try_config(specs, list(field_values))
    if cfg is None:
        message = f"**These settings cannot run yet:**\n```\n{error}\n```"
        return gr.skip(), "", message, gr.skip(), "Fix the settings in tab 2 first:\n```\n" + error + "\n```"
    gpus = hardware_view.plan_gpus(gpu_choice, count)
    budget_html, advice_md = budget_view.render(cfg, gpus)
    return budget_html, advice_md, "", presets.headless_commands(cfg, preset), train_view.summary_markdown(cfg)


def _train_view(seen: dict):
    """Poll the current job: status, numbers, loss curve (redrawn only when new points arrived), log tail."""
    manager = get_manager()
    job = manager.current()
    if job is None:
        return (
            train_view.status_html(None, None),
            "",
            gr.skip(),
            "",
            gr.update(interactive=True),
            gr.update(interactive=False),
            seen,
        )
    state = job.state()
    progress = job.progress
    key = f"{job.run_dir}|{len(progress.losses)}|{len(progress.eval_losses)}"
    plot = train_view.loss_figure(progress) if seen.get("plot") != key else gr.skip()
    busy = state in ("running", "stopping")
    return (
        train_view.status_html(job, state),
        train_view.stats_html(progress),
        plot,
        job.log_tail(),
        gr.update(interactive=not busy),
        gr.update(interactive=state == "running"),
        {**seen, "plot": key},
    )


def _adapters(specs, values) -> list[str]:
    from finetune_app.gui.chat import find_adapters

    cfg, _ = try_config(specs, list(values))
    runs_dir = Path(cfg.output.dir if cfg else RunConfig().output.dir)
    found = find_adapters(runs_dir)
    job = get_manager().current()
    if job is not None and job.progress.adapter_path and job.progress.adapter_path not in found:
        found.insert(0, job.progress.adapter_path)
    return found


def _example_questions() -> list[list[str]]:
    try:
        from finetune_app.data import demo_heldout_questions

        return [[row["question"]] for row in demo_heldout_questions()[:4]]
    except Exception:
        return [["What is the capital of Veloria?"]]


def _export_stream(action: str):
    """A generator handler: runs the export in a thread and streams its progress messages."""

    def run(run_dir, dtype, repo, what, is_private):
        from finetune_app import export
        from finetune_app.hub import PushError, preflight_push

        if not run_dir:
            yield "", "Pick a run first (train one in tab 3)."
            return
        messages: list[str] = []
        outcome: dict[str, str] = {}

        def work():
            try:
                if action == "adapter":
                    outcome["path"] = str(export.export_adapter(run_dir, progress=messages.append))
                elif action == "merge":
                    outcome["path"] = str(export.merge_adapter(run_dir, dtype=dtype, progress=messages.append))
                else:
                    if not repo:
                        raise export.ExportError("enter a Hub repo id (your-name/model-name) to push to")
                    # Token and repo are checked before a merge that can take a long time.
                    preflight_push(repo, bool(is_private))
                    if what == "merged":
                        folder = export.merge_adapter(run_dir, dtype=dtype, repo_id=repo, progress=messages.append)
                    else:
                        folder = export.export_adapter(run_dir, repo_id=repo, progress=messages.append)
                    outcome["url"] = export.push_export(
                        run_dir, folder, repo, bool(is_private), progress=messages.append
                    )
            except (export.ExportError, PushError, ConfigError) as exc:
                outcome["error"] = str(exc)
            except Exception as exc:  # the user must see why, not a spinner that never ends
                outcome["error"] = f"{type(exc).__name__}: {exc}"

        worker = threading.Thread(target=work, daemon=True)
        worker.start()
        while worker.is_alive():
            yield "\n".join(messages), "Working ..."
            time.sleep(0.5)
        if "error" in outcome:
            result = f"**Failed:** {outcome['error']}"
        elif "url" in outcome:
            result = f"**Pushed:** [{outcome['url']}]({outcome['url']})"
        else:
            result = f"**Saved to** `{outcome.get('path')}`"
        yield "\n".join(messages), result

    return run


def launch(port: int | None = None, open_browser: bool = True) -> None:
    """Serve the app on 127.0.0.1 (a free port unless `port`), optionally opening a browser tab."""
    demo = build_app()
    demo.queue(default_concurrency_limit=4)
    demo.launch(
        server_name="127.0.0.1",
        server_port=port,
        inbrowser=open_browser,
        css=budget_view.CSS,
        theme=gr.themes.Soft(),
        footer_links=[],
        show_error=True,
    )
