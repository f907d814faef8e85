import json
import os
import subprocess
import sys

HEAVY = ["torch", "transformers", "peft", "trl", "bitsandbytes", "datasets"]


def test_building_the_gui_imports_no_heavy_library(tmp_path):
    # In a fresh interpreter: this process may already have imported torch for other tests.
    probe = (
        "import json, sys\n"
        "from finetune_app.gui.app import build_app\n"
        "build_app()\n"
        f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))\n"
    )
    env = dict(os.environ, FINETUNE_APP_HOME=str(tmp_path), GRADIO_ANALYTICS_ENABLED="False")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []
