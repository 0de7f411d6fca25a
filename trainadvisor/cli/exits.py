"""What each command's exit codes mean, as `--help` shows them under the options (and the
docs' CLI reference repeats them)."""

PROFILE = """\b
Exit codes:
  0  the report was written
  2  a usage problem: no such script, no training step seen, bad --out or rule file
  3  the script failed (its error is shown; what was measured is still reported)
  1  trainadvisor itself failed (please report it)"""

ANALYZE = """\b
Exit codes:
  0  the report was written
  2  a usage problem: a missing path, a folder without traces, a file that is not a complete
     trace, an empty trace, a bad --out or rule file
  1  trainadvisor itself failed (please report it)"""

REPORT = """\b
Exit codes:
  0  the report was written
  2  no report.json in a DIR, one this version cannot read, or several DIRs without --out
  1  trainadvisor itself failed (please report it)"""

COMPARE = """\b
Exit codes:
  0  neutral, improvement_likely or inconclusive (with --strict, inconclusive exits 1)
  1  regression_likely: HEAD worse on --metric by more than --gate, beyond the runs' noise (or
     HEAD's run did not complete)
  2  a usage problem: no report at a path, one this version cannot read, a report without
     the run asked for, no such baseline"""

BASELINE = """\b
Exit codes:
  0  done
  2  a usage problem: a bad name, no such baseline, a report this version cannot read, a store
     that cannot be reached
  1  trainadvisor itself failed (please report it)"""

MCP = """\b
Exit codes:
  0  the client closed the connection
  2  the Model Context Protocol SDK is not installed (pip install 'trainadvisor[mcp]')
  1  trainadvisor itself failed (please report it)"""

EXPORT = """\b
Exit codes:
  0  logged into every tracker given
  4  a tracker was not reached (missing package, server down, bad credentials): said above
  2  a usage problem: no report there, one this version cannot read, no --to
  1  trainadvisor itself failed (please report it)"""
