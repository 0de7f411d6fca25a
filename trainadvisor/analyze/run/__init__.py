"""A run's measurements: one summarised run and the table the rules read (`summary`, from a
trace's measures, `measures`, and the child's runtime facts), its windows in words (`shapes`),
the script's length (`length`), other processes' load during it (`disturbance`), the GPUs'
energy (`energy`), its ranks (`ranks`), the critical path across them (`critical_path`) and
its headline figures (`headline`).

May import: analyze.trace, frameworks (a loop's framework), compute, memory, measure (the
torch-free window configuration), records, errors."""
