"""trainadvisor for coding agents: `trainadvisor mcp` serves the Model Context Protocol over
stdio (`server`), and every tool answers with a compact summary of a report (`digest`: at most
`SUMMARY_MAX_BYTES`, with the report's path for the rest). The tools run trainadvisor's own
command line in a child process, so an agent gets exactly the CLI's verdicts, and cancelling a
tool stops that process, the script and its workers.

May import: report (reading reports), analyze (the measurement table), records, errors, _serial,
_version."""
