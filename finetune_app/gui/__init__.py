"""The Gradio GUI. `finetune_app.gui.app.launch()` starts it; training always runs in a separate process."""
