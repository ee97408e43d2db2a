"""One thin module per CLI subcommand; each exposes `command` (a click.Command)."""
