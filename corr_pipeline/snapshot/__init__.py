"""One snapshot, without Dagster: its parameters, its steps (written once, called by the Dagster
assets and by the benchmark), the verifications of each step's contract, and the markdown
previews of its results. See ``docs/architecture.md`` for where this layer sits."""
