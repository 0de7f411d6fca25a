"""The options of every command, each defined once: their types (`kinds`: durations, sizes,
trace locations) and the table of each command's options (`table`), from which the command
line's decorators, the options record, what each run and the user's process receive, the command
that repeats a run and the docs' CLI reference are derived.

May import: analyze (a trace location's URL test), measure (the window's default size)."""
