"""`trainadvisor profile`: the stages of one command, each returning plain data that is saved as it
finishes. `command` runs them: the baseline run (`runs`), the diagnosis, each fix's trials in
windows of the live run or in fresh runs (`tuning`, `trials`), the fixes chosen together measured
with and without each (`attribution`), the confirmation run (`confirm`), the verdicts (`judge`).

May import: measure/, analyze/ (the trace and run analysis), fixes/, frameworks/, report/ (to
write the report folder), engine, records and the package's top-level helpers; never cli or
advising/."""
