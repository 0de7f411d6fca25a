"""`trainadvisor analyze` (`command`) and the analysis every command uses: profiler traces read
in bounded memory and time, from disk or object storage (`sources`, `stream`, `kineto_json`,
`columns`, `reading`, `pipeline`, `archives`, `bounds`), their steps,
breakdown, device work, the loop's host work, copies, syncs and call sites (`steps`, `kineto`,
`device`, `host`, `facts`, `copies`, `callsites`, `kernels`, into `trace_records`), named
measurements for the rules (`measures`, `summary`), a run's windows and the script's length
(`shapes`, `length`), other processes' load (`disturbance`), the GPUs' energy (`energy`), ranks
(`ranks`, `rank_table`, and `rank_overview` for many of them) and the engines that analyse each
trace, on this machine's cores or a Ray cluster (`engines`).

May import: engine (the command's diagnosis), frameworks (a loop's framework), compute, memory,
measure (the torch-free window configuration), records, _serial, _version, errors."""
