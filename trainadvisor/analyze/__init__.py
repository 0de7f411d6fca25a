"""`trainadvisor analyze` (`command`) and the analysis every command uses: profiler traces read
in bounded memory and time (`stream`, `columns`, `reading`, `archives`, `bounds`), their steps,
breakdown, device work, the loop's host work, copies, syncs and call sites (`steps`, `kineto`,
`device`, `host`, `facts`, `copies`, `callsites`, `kernels`, into `trace_records`), named
measurements for the rules (`measures`, `summary`), a run's windows and the script's length
(`shapes`, `length`), other processes' load (`disturbance`), the GPUs' energy (`energy`) and ranks
(`ranks`, `rank_table`).

May import: engine (the command's diagnosis), frameworks/ (a loop's framework), records and the
top-level helpers; never profile/, advising/, report/, measure/ or cli."""
