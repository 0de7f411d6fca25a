"""Writes its pid to the file its first argument names, then sleeps ten minutes before any
training step (a slow start-up: a dataset being downloaded, say)."""

import os
import sys
import time
from pathlib import Path

written = Path(sys.argv[1])
partial = written.with_name(written.name + ".tmp")
partial.write_text(str(os.getpid()))
partial.replace(written)  # whole or absent: the test reads it as soon as it is there
time.sleep(600)
