"""How fast the GUI starts: import time of finetune_app.gui.app, and `python launcher.py --no-browser --port P`
until the first page is served. Also reports which heavy libraries the GUI process imported (should be none).

    python benchmarks/bench_gui_startup.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "transformers", "peft", "trl", "bitsandbytes", "datasets")

IMPORT_PROBE = f"""
import json, sys, time
started = time.perf_counter()
import finetune_app.gui.app as app
imported = time.perf_counter() - started
demo = app.build_app()
built = time.perf_counter() - started
heavy = [m for m in {HEAVY!r} if m in sys.modules]
print(json.dumps({{"import_s": imported, "build_s": built, "heavy_imported": heavy}}))
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def measure_import(env: dict[str, str]) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", IMPORT_PROBE], capture_output=True, text=True, env=env, cwd=REPO, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def measure_first_page(env: dict[str, str], timeout: float = 180.0) -> float:
    port = free_port()
    started = time.perf_counter()
    process = subprocess.Popen(
        [sys.executable, "launcher.py", "--no-browser", "--port", str(port)],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        while time.perf_counter() - started < timeout:
            if process.poll() is not None:
                raise RuntimeError(f"launcher.py exited with {process.returncode}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2) as response:
                    if response.status == 200:
                        return time.perf_counter() - started
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"no page after {timeout} s")
    finally:
        process.terminate()
        process.wait(timeout=20)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    env = dict(os.environ, GRADIO_ANALYTICS_ENABLED="False", HF_HUB_OFFLINE="1")
    imports = [measure_import(env) for _ in range(args.repeats)]
    pages = [measure_first_page(env) for _ in range(args.repeats)]
    result = {
        "import_finetune_app.gui.app_s": round(statistics.median(i["import_s"] for i in imports), 3),
        "import_and_build_blocks_s": round(statistics.median(i["build_s"] for i in imports), 3),
        "launcher_first_page_s": round(statistics.median(pages), 3),
        "launcher_first_page_all_s": [round(p, 3) for p in pages],
        "heavy_libraries_imported": sorted({m for i in imports for m in i["heavy_imported"]}),
        "python": sys.version.split()[0],
    }
    print(json.dumps(result, indent=2))
    return 0 if not result["heavy_libraries_imported"] else 1


if __name__ == "__main__":
    sys.exit(main())
