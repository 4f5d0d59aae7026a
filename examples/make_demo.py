"""Build the demo (same as `multilora demo OUT_DIR`): python examples/make_demo.py [OUT_DIR] [--force]."""

from __future__ import annotations

import sys

from multilora_cli.cli import main

if __name__ == "__main__":
    main(["demo", *sys.argv[1:]])
