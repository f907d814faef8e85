#!/usr/bin/env python
"""Start finetune_app.

python launcher.py                      # the GUI on 127.0.0.1 (a free port), opens a browser
python launcher.py --port 7860 --no-browser
python launcher.py --preset presets/demo-smollm2-135m.yaml [--set key=value ...]   # headless training
"""

import argparse
import sys


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", help="train this YAML preset headless instead of opening the GUI")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="key=value",
        help="override a preset field (repeatable), e.g. --set training.max_steps=20",
    )
    parser.add_argument("--run-dir", help="run directory for --preset (default: output.dir/output.run_name)")
    parser.add_argument("--resume", action="store_true", help="continue --run-dir from its last checkpoint")
    parser.add_argument("--port", type=int, help="GUI port on 127.0.0.1 (default: a free one)")
    parser.add_argument("--no-browser", action="store_true", help="do not open a browser for the GUI")
    args = parser.parse_args(argv)

    from finetune_app.cli import main as cli_main

    if args.preset or args.resume:
        command = ["train"] + ([args.preset] if args.preset else []) + args.overrides
        if args.run_dir:
            command += ["--run-dir", args.run_dir]
        if args.resume:
            command.append("--resume")
        return cli_main(command)
    command = (
        ["gui"] + (["--port", str(args.port)] if args.port else []) + (["--no-browser"] if args.no_browser else [])
    )
    return cli_main(command)


if __name__ == "__main__":
    sys.exit(main())
