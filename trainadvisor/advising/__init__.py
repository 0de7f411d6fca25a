"""`@advise` and the framework callbacks: the measuring window inside the user's own process
(`advisor`), its trial windows (`trials`), its report (`report`), and the Lightning and Hugging
Face callbacks (`integrations`, public as `trainadvisor.integrations`).

May import: profile (the trial decisions and window sizes the `profile` command shares), training,
report, trackers, analyze, rulebook, options, fixes, frameworks, measure, records, redact, resources,
errors."""
