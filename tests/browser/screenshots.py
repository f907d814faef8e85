"""Take the README screenshots of the main screens into docs/screenshots/ (not a test).

python tests/browser/screenshots.py            # trains the real demo preset on CPU (a few minutes)
python tests/browser/screenshots.py --quick    # a tiny random model instead (seconds; answers are noise)
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from browser.conftest import CHROMIUM, AppServer  # noqa: E402

OUT = REPO / "docs" / "screenshots"


def quick_preset(root: Path) -> str:
    from tiny import make_tiny_model_dir

    model = make_tiny_model_dir(root / "tiny-model")
    return (
        f"model: {{name_or_path: '{model}', dtype: float32}}\n"
        "quantization: {load_in: none, double_quant: false}\n"
        "training: {max_steps: 30, micro_batch_size: 4, max_length: 128, logging_steps: 1, eval_steps: 5}\n"
        "data: {eval_fraction: 0.15}\n"
    )


def shoot(page, name: str, full_page: bool = False) -> None:
    page.wait_for_timeout(600)  # let bars and plots finish their transitions
    page.screenshot(path=str(OUT / f"{name}.png"), full_page=full_page)
    print(f"wrote {OUT / name}.png")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="train a tiny random model instead of the demo")
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    OUT.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="finetune-app-shots-"))
    demo_preset = (REPO / "presets" / "demo-smollm2-135m.yaml").read_text()
    if not args.quick:
        # The demo preset, eval on a held-out slice so both curves show, and a checkpoint now and then.
        demo_preset += ""
    presets = {"demo-smollm2-135m": demo_preset}
    if args.quick:
        presets["quick-tiny"] = quick_preset(root)
    server = AppServer(root, presets).start()
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(
                executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"]
            )
            page = browser.new_page(viewport={"width": 1440, "height": 1000}, device_scale_factor=1)
            page.goto(server.url)
            page.wait_for_selector("#budget-total[data-bytes]:not([data-bytes=''])", timeout=60_000)

            page.get_by_role("tab", name="1 · Hardware").click()
            shoot(page, "hardware")

            page.get_by_role("tab", name="2 · Configure").click()
            shoot(page, "configure")
            page.locator("#preview-btn").click()
            page.locator("#data-preview").wait_for(timeout=120_000)
            page.locator("#field-data-format").scroll_into_view_if_needed()
            shoot(page, "data-preview")

            # A setting that does not fit: long sequences, big batches, no checkpointing.
            page.locator("#section-training > button").first.click()
            page.locator("#field-training-max_length input").fill("16384")
            page.locator("#field-training-micro_batch_size input").fill("8")
            page.locator("#section-memory > button").first.click()
            page.locator("#field-memory-gradient_checkpointing input[type=checkbox]").click()
            page.locator("#budget-verdict[data-verdict=does_not_fit]").wait_for(timeout=10_000)
            page.evaluate("window.scrollTo(0, 0)")
            shoot(page, "budget-does-not-fit")
            page.locator("#fit-btn").click()
            page.locator("#fit-message").get_by_text("Fit to my GPU").wait_for(timeout=10_000)
            page.evaluate("window.scrollTo(0, 0)")
            shoot(page, "budget-fit-to-gpu")

            preset = "quick-tiny" if args.quick else "demo-smollm2-135m"
            page.locator("#preset-pick input").click()
            page.get_by_role("option", name=preset, exact=True).click()
            page.locator("#preset-load").click()
            page.get_by_role("tab", name="3 · Train").click()
            page.locator("#start-btn").click()
            page.locator("#run-status[data-state=completed]").wait_for(timeout=1_800_000)
            shoot(page, "train")

            page.get_by_role("tab", name="4 · Try it").click()
            page.locator("#adapter-pick input").wait_for()
            page.wait_for_timeout(1500)
            page.get_by_label("Your question").fill("What is the capital of Veloria?")
            page.get_by_role("button", name="Ask both").click()
            page.wait_for_function(
                "() => document.querySelector('#tuned-answer textarea')?.value.length > 0", timeout=600_000
            )
            shoot(page, "try-it")

            page.get_by_role("tab", name="5 · Export").click()
            page.wait_for_timeout(1500)
            page.get_by_role("button", name="Save adapter").click()
            page.locator("#export-result").get_by_text("Saved to").wait_for(timeout=120_000)
            shoot(page, "export")
            browser.close()
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
