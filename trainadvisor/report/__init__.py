"""Reports, from saved records only: report.json, report.md and report.html and the terminal
summary of a run (`render`), the report folder's checks and lock (`folder`), `analyze`'s summary
(`analyze`), `compare` and its CI gate (`compare`), the merge of several nodes' reports
(`merge`), a saved report read back for a command or an agent (`saved`) and Markdown that shows
user text as text (`mdtext`).

May import: analyze (summaries of runs), rulebook, records, units, resources (the templates a
notebook renders with), _serial, _version, errors."""
