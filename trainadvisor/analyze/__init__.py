"""`trainadvisor analyze` and the analysis every command uses, in three layers, each a folder:
`read/` (bytes in: a trace's bytes from disk, archives or object storage, read in bounded
memory and time into compact columns), `trace/` (one trace's analysis: its steps, breakdown,
device work, the loop's host work, copies, syncs, call sites, kernels and FLOPs) and `run/` (a
run's measurements: the table the rules read, its windows, the script's length, other processes'
load, the GPUs' energy, its ranks). Here: the command (`command`), the engines that analyse each
trace on this machine's cores or a Ray cluster (`engines`), and many ranks compared
(`rank_table`, `rank_overview`).

May import: analyze.run, analyze.trace, analyze.read, rulebook (the command's diagnosis), records,
_serial, _version, errors."""
