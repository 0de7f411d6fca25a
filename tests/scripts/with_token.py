"""short_run.py's slow-input loop behind a command line that takes credentials, as training
scripts do (`--hf-token`, `--wandb-key`); it never prints them."""

import argparse
import runpy
import sys
from pathlib import Path

parser = argparse.ArgumentParser()
parser.add_argument("--hf-token", required=True)
parser.add_argument("--wandb-key", default="")
args, rest = parser.parse_known_args()
loop = Path(__file__).with_name("short_run.py")
sys.argv = [str(loop), "--max-steps", "100000", *rest]
runpy.run_path(str(loop), run_name="__main__")
