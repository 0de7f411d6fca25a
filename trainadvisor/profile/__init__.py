"""`trainadvisor profile`: the stages of one command, each returning plain data that is saved as it
finishes. `command` runs them: the baseline run (`runs`), the diagnosis, each fix's trials in
windows of the live run or in fresh runs (`tuning`, `trials`), the fixes chosen together measured
with and without each (`attribution`), the confirmation run (`confirm`), the verdicts (`judge`).

May import: analyze (the trace and run analysis), report (to write the report folder), rulebook,
options, fixes, frameworks, measure, compute, memory, records, redact, units (a duration on a
clock), errors."""
