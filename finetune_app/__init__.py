"""finetune_app: QLoRA fine-tuning with a live memory budget, headless or from a Gradio GUI."""

__version__ = "0.1.0"
